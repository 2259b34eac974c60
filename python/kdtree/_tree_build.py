"""tree_build: the draft tree from a drafter's per-depth top-K (DDTree best-first), as torch.ops.kdtree.tree_build."""

from typing import NamedTuple, Tuple

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._plan_cache import PlanCache


class TreeBuildResult(NamedTuple):
    """Padded per-request layout: request b's nodes are rows [0, node_counts[b]) of [b]; the rest are -1
    (ids) / 0 (mask words). Nodes are best-first, parents before children; node 0 is the root."""
    tokens: torch.Tensor        # [B, W] int32
    parents: torch.Tensor       # [B, W] int32, root -1
    depths: torch.Tensor        # [B, W] int32, root 0
    positions: torch.Tensor     # [B, W] int32 = prefix_len + depth
    tree_mask: torch.Tensor     # [B, W, ceil(W/64)] int64
    first_child: torch.Tensor   # [B, W] int32, -1 = none
    next_sibling: torch.Tensor  # [B, W] int32, -1 = none
    node_counts: torch.Tensor   # [B] int32 = 1 + selected draft nodes
    scores: torch.Tensor        # [B, W] float32 path log-probability


def plan(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, require_cuda=True):
    C.tensor("draft_tokens", draft_tokens, dtypes=(torch.int32,), ndim=3)
    C.contiguous("draft_tokens", draft_tokens)
    batch, depth, top_k = draft_tokens.shape
    C.tensor("draft_logprobs", draft_logprobs, dtypes=(torch.float32,), ndim=3)
    C.shape("draft_logprobs", draft_logprobs, (batch, depth, top_k))
    C.contiguous("draft_logprobs", draft_logprobs)
    C.tensor("root_tokens", root_tokens, dtypes=(torch.int32,), ndim=1)
    C.shape("root_tokens", root_tokens, (batch,))
    C.contiguous("root_tokens", root_tokens)
    C.tensor("prefix_lens", prefix_lens, dtypes=(torch.int32,), ndim=1)
    C.shape("prefix_lens", prefix_lens, (batch,))
    C.contiguous("prefix_lens", prefix_lens)
    max_tree_nodes = C.integer("max_tree_nodes", max_tree_nodes)
    budget = C.integer("budget", budget)
    C.one_of("max_tree_nodes", max_tree_nodes, C.TREE_WIDTHS, "tree width")
    if not 1 <= depth <= 16:
        raise ValueError(f"draft_tokens: depth D = shape[1] = {depth} is outside [1, 16]")
    if not 1 <= top_k <= 64:
        raise ValueError(f"draft_tokens: top-K = shape[2] = {top_k} is outside [1, 64]")
    if not 1 <= budget <= max_tree_nodes - 1:
        raise ValueError(f"budget: {budget} is outside [1, max_tree_nodes - 1 = {max_tree_nodes - 1}]")
    named = [("draft_tokens", draft_tokens), ("draft_logprobs", draft_logprobs), ("root_tokens", root_tokens),
             ("prefix_lens", prefix_lens)]
    device = C.same_device(named) if require_cuda else draft_tokens.device
    return batch, depth, top_k, device


def _outputs(new, batch, w):
    i32 = dict(dtype=torch.int32)
    return TreeBuildResult(new((batch, w), **i32), new((batch, w), **i32), new((batch, w), **i32),
                           new((batch, w), **i32), new((batch, w, C.mask_words(w)), dtype=torch.int64),
                           new((batch, w), **i32), new((batch, w), **i32), new((batch,), **i32),
                           new((batch, w), dtype=torch.float32))


_T = torch.Tensor
_I32, _I64, _F32 = torch.int32, torch.int64, torch.float32
_WIDTH_SET = frozenset(C.TREE_WIDTHS)
_Args = _lib.TreeBuildArgs


def _fast_plan(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, w):
    """The common case in one pass of cheap tests: (batch, depth, top_k, device index), or None; then plan()
    (the authority, which names what is wrong) decides. Accepts nothing that plan() rejects."""
    if (type(draft_tokens) is not _T or type(draft_logprobs) is not _T or type(root_tokens) is not _T
            or type(prefix_lens) is not _T or type(w) is not int or type(budget) is not int):
        return None
    ds = draft_tokens.shape
    if (len(ds) != 3 or draft_tokens.dtype is not _I32 or draft_logprobs.dtype is not _F32
            or root_tokens.dtype is not _I32 or prefix_lens.dtype is not _I32 or draft_logprobs.shape != ds
            or w not in _WIDTH_SET or not 1 <= budget < w):
        return None
    b, depth, top_k = ds
    if (not 1 <= depth <= 16 or not 1 <= top_k <= 64 or root_tokens.shape != (b,) or prefix_lens.shape != (b,)
            or not draft_tokens.is_contiguous() or not draft_logprobs.is_contiguous()
            or not root_tokens.is_contiguous() or not prefix_lens.is_contiguous()):
        return None
    cuda = draft_tokens.is_cuda
    if not cuda and not C.accept_cpu(draft_tokens, draft_logprobs, root_tokens, prefix_lens):
        return None
    index = draft_tokens.get_device()
    if (draft_logprobs.get_device() != index or root_tokens.get_device() != index
            or prefix_lens.get_device() != index or draft_logprobs.is_cuda is not cuda
            or root_tokens.is_cuda is not cuda or prefix_lens.is_cuda is not cuda):
        return None
    return b, depth, top_k, index


_cache = PlanCache()  # (scalars, tensors) -> (batch, depth, top_k, device index, allocator)


def _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes):
    """Checks, allocates and launches; returns the TreeBuildResult."""
    tensors = (draft_tokens, draft_logprobs, root_tokens, prefix_lens)
    scalars = (budget, type(budget), max_tree_nodes, type(max_tree_nodes))
    f = _cache.find(scalars, tensors)
    if f is None:  # not seen lately: the quick test, else the full checks (which name what is wrong)
        f = _fast_plan(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes)
        if f is None:
            batch, depth, top_k, device = plan(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget,
                                               max_tree_nodes)
            f = (batch, depth, top_k, C.device_index(device))
        f += (_launch.empty_fn(f[3]),)
        _cache.add(scalars, tensors, f)
    batch, depth, top_k, index, empty = f
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes)
    w = max_tree_nodes
    shape, stride = (batch, w), (w, 1)
    words = C.mask_words(w)
    r = TreeBuildResult(empty(shape, stride, _I32), empty(shape, stride, _I32), empty(shape, stride, _I32),
                        empty(shape, stride, _I32), empty((batch, w, words), (w * words, words, 1), _I64),
                        empty(shape, stride, _I32), empty(shape, stride, _I32), empty((batch,), (1,), _I32),
                        empty(shape, stride, _F32))
    if batch == 0:
        return r
    a = _Args(batch, depth, top_k, budget, w)
    a.draft_tokens, a.draft_logprobs = draft_tokens.data_ptr(), draft_logprobs.data_ptr()
    a.root_tokens, a.prefix_lens = root_tokens.data_ptr(), prefix_lens.data_ptr()
    a.tokens, a.parents, a.depths, a.positions = (r.tokens.data_ptr(), r.parents.data_ptr(),
                                                  r.depths.data_ptr(), r.positions.data_ptr())
    a.tree_mask = r.tree_mask.data_ptr()
    a.first_child, a.next_sibling = r.first_child.data_ptr(), r.next_sibling.data_ptr()
    a.node_counts, a.scores = r.node_counts.data_ptr(), r.scores.data_ptr()
    a.stream = _launch.current_stream(index)
    status = _launch.call(_lib.api.tree_build, index, a)
    if status:
        _lib.check(status, "kdtree_tree_build")
    return r


_RESULT = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op("kdtree::tree_build", mutates_args=())
def tree_build_op(draft_tokens: torch.Tensor, draft_logprobs: torch.Tensor, root_tokens: torch.Tensor,
                  prefix_lens: torch.Tensor, budget: int, max_tree_nodes: int) -> _RESULT:
    """The operator: the nine TreeBuildResult fields as a tuple."""
    return tuple(_run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes))


@tree_build_op.register_fake
def _(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes):
    batch, _, _, _ = plan(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes,
                          require_cuda=False)
    return tuple(_outputs(lambda shape, dtype: draft_tokens.new_empty(shape, dtype=dtype), batch, max_tree_nodes))


def tree_build(draft_tokens, draft_logprobs, root_tokens, prefix_lens, *, budget, max_tree_nodes):
    """Builds each request's draft tree on the GPU: the `budget` most probable draft nodes (best-first).

    draft_tokens [B, D, K] int32 and draft_logprobs [B, D, K] float32 (descending along K): the drafter's
    top-K per depth (D in 1..16, K in 1..64); root_tokens [B] int32; prefix_lens [B] int32 (KV position
    of the root). budget in 1..W-1; max_tree_nodes W in {16, 32, 64, 128}. Returns a TreeBuildResult.
    """
    args = (draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes)
    if type(draft_tokens) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(*args)
    return TreeBuildResult._make(torch.ops.kdtree.tree_build(*args))
