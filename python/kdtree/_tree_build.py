"""tree_build: the draft tree from a drafter's per-depth top-K (DDTree best-first), as torch.ops.kdtree.tree_build
(and torch.ops.kdtree.tree_build_out, which writes into caller-owned outputs)."""

from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

MAX_DEPTH = 16  # draft depth D and top-K bounds of the kernel (kdtree.h)
MAX_TOP_K = 64


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


_I32, _I64, _F32 = torch.int32, torch.int64, torch.float32
# Each output's dtype and shape: "bw" = [B, W], "b" = [B], "mask" = [B, W, ceil(W/64)].
_OUTPUTS = tuple(zip(TreeBuildResult._fields, (_I32, _I32, _I32, _I32, _I64, _I32, _I32, _I32, _F32),
                     ("bw", "bw", "bw", "bw", "mask", "bw", "bw", "b", "bw")))
_NAMED = ("draft_tokens", "draft_logprobs", "root_tokens", "prefix_lens")


class Plan(NamedTuple):
    """What a launch depends on besides addresses and the stream."""
    batch_size: int
    depth: int
    top_k: int
    budget: int
    max_tree_nodes: int
    device: int  # CUDA index (-1: the CPU tests, or a fake implementation)


def check(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, out=None,
          require_cuda=True):
    """The Plan of these arguments (and of `out`, a TreeBuildResult to write into, when given); raises
    TypeError/ValueError naming the argument that is wrong."""
    ds = C.tensor("draft_tokens", draft_tokens, (_I32,), 3)
    batch, depth, top_k = ds
    ls = C.tensor("draft_logprobs", draft_logprobs, (_F32,), 3)
    if ls != ds:
        C.shape("draft_logprobs", ls, (batch, depth, top_k))
    C.shape("root_tokens", C.tensor("root_tokens", root_tokens, (_I32,), 1), (batch,))
    C.shape("prefix_lens", C.tensor("prefix_lens", prefix_lens, (_I32,), 1), (batch,))
    w = C.integer("max_tree_nodes", max_tree_nodes)
    budget = C.integer("budget", budget)
    C.width("max_tree_nodes", w)
    if not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"draft_tokens: depth D = shape[1] = {depth} is outside [1, {MAX_DEPTH}]")
    if not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"draft_tokens: top-K = shape[2] = {top_k} is outside [1, {MAX_TOP_K}]")
    if not 1 <= budget <= w - 1:
        raise ValueError(f"budget: {budget} is outside [1, max_tree_nodes - 1 = {w - 1}]")
    named = [("draft_tokens", draft_tokens), ("draft_logprobs", draft_logprobs), ("root_tokens", root_tokens),
             ("prefix_lens", prefix_lens)]
    if out is not None:
        if not isinstance(out, tuple) or len(out) != len(_OUTPUTS):
            raise TypeError(f"out: expected a TreeBuildResult (nine tensors), got {type(out).__name__}")
        shapes = {"bw": (batch, w), "b": (batch,), "mask": (batch, w, C.mask_words(w))}
        for (name, dtype, kind), t in zip(_OUTPUTS, out):
            C.shape(f"out.{name}", C.tensor(f"out.{name}", t, (dtype,)), shapes[kind])
            named.append((f"out.{name}", t))
    return Plan(batch, depth, top_k, budget, w, C.device_index(named, require_cuda))


def _make_launch(p):
    return _launch.Launch(p, p.device, _lib.TreeBuildArgs(p.batch_size, p.depth, p.top_k, p.budget, p.max_tree_nodes))


_launches = _launch.Launches(_make_launch)
_cache = PlanCache()  # (scalars, tensors) -> Launch


def _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, out=None):
    """Checks, allocates (unless `out`) and launches; returns the TreeBuildResult (`out` when given)."""
    if out is None:
        tensors = (draft_tokens, draft_logprobs, root_tokens, prefix_lens)
    else:
        tensors = (draft_tokens, draft_logprobs, root_tokens, prefix_lens, *out)
    scalars = (budget, type(budget), max_tree_nodes, type(max_tree_nodes), len(tensors))
    e = _cache.find(scalars, tensors)
    if e is None:  # not seen lately: check and plan
        e = _launches.get(check(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, out))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, out)
    if out is None:
        batch, w = e.plan.batch_size, e.plan.max_tree_nodes
        empty = e.empty
        shape, stride = (batch, w), (w, 1)
        words = (w + 63) >> 6
        # Nine allocations through torch's graph allocator (about 1 us each): carving one buffer into views
        # costs more (each view is a dispatched op, 1-7 us); callers that want none pass out=.
        out = TreeBuildResult(empty(shape, stride, _I32), empty(shape, stride, _I32), empty(shape, stride, _I32),
                              empty(shape, stride, _I32), empty((batch, w, words), (w * words, words, 1), _I64),
                              empty(shape, stride, _I32), empty(shape, stride, _I32), empty((batch,), (1,), _I32),
                              empty(shape, stride, _F32))
        if batch == 0:
            return out
    elif e.plan.batch_size == 0:
        return out
    a = e.args()
    a.draft_tokens, a.draft_logprobs = draft_tokens.data_ptr(), draft_logprobs.data_ptr()
    a.root_tokens, a.prefix_lens = root_tokens.data_ptr(), prefix_lens.data_ptr()
    (a.tokens, a.parents, a.depths, a.positions, a.tree_mask, a.first_child, a.next_sibling, a.node_counts,
     a.scores) = [t.data_ptr() for t in out]
    a.stream = _launch.current_stream(index)
    status = _lib.api.tree_build(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_tree_build")
    return out


_INPUTS = "Tensor draft_tokens, Tensor draft_logprobs, Tensor root_tokens, Tensor prefix_lens, int budget, int max_tree_nodes"
lib.define(f"tree_build({_INPUTS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
# Outputs as mutated arguments (not aliased returns), so torch.compile functionalizes it like any in-place op.
lib.define(f"tree_build_out({_INPUTS}, Tensor(a!) tokens, Tensor(b!) parents, Tensor(c!) depths, "
           "Tensor(d!) positions, Tensor(e!) tree_mask, Tensor(f!) first_child, Tensor(g!) next_sibling, "
           "Tensor(h!) node_counts, Tensor(i!) scores) -> ()")


def _op(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes):
    return tuple(_run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes))


def _op_out(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, *out):
    _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, TreeBuildResult(*out))


for _key in ("CUDA", "CPU"):  # CPU: only to reach the checks ('expected a CUDA tensor'); the CPU tests
    lib.impl("tree_build", _op, _key)
    lib.impl("tree_build_out", _op_out, _key)


@torch.library.register_fake("kdtree::tree_build", lib=lib)
def _(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes):
    p = check(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, require_cuda=False)
    b, w = p.batch_size, p.max_tree_nodes
    new = draft_tokens.new_empty
    i32 = dict(dtype=_I32)
    return (new((b, w), **i32), new((b, w), **i32), new((b, w), **i32), new((b, w), **i32),
            new((b, w, C.mask_words(w)), dtype=_I64), new((b, w), **i32), new((b, w), **i32), new((b,), **i32),
            new((b, w), dtype=_F32))


@torch.library.register_fake("kdtree::tree_build_out", lib=lib)
def _(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, *out):
    check(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes, TreeBuildResult(*out),
          require_cuda=False)


_T = torch.Tensor


def tree_build(draft_tokens, draft_logprobs, root_tokens, prefix_lens, *, budget, max_tree_nodes, out=None):
    """Builds each request's draft tree on the GPU: the `budget` most probable draft nodes (best-first).

    draft_tokens [B, D, K] int32 and draft_logprobs [B, D, K] float32 (descending along K): the drafter's
    top-K per depth (D in 1..16, K in 1..64); root_tokens [B] int32; prefix_lens [B] int32 (KV position
    of the root). budget in 1..W-1; max_tree_nodes W one of kdtree.supported_shapes().widths. Returns a
    TreeBuildResult. out: a TreeBuildResult of contiguous tensors of the same shapes, dtypes and device
    (e.g. an earlier call's) to write into instead of allocating nine new tensors; it is returned.
    """
    if type(draft_tokens) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes,
                    out if out is None or type(out) is TreeBuildResult else _as_result(out))
    # torch's dispatcher would reject a non-tensor or non-int argument without naming it: check here.
    for name, t in zip(_NAMED, (draft_tokens, draft_logprobs, root_tokens, prefix_lens)):
        C.tensor(name, t, contiguous=False)
    budget, max_tree_nodes = C.integer("budget", budget), C.integer("max_tree_nodes", max_tree_nodes)
    if out is None:
        return TreeBuildResult._make(torch.ops.kdtree.tree_build(draft_tokens, draft_logprobs, root_tokens,
                                                                 prefix_lens, budget, max_tree_nodes))
    out = _as_result(out)
    for (name, _, _), t in zip(_OUTPUTS, out):
        C.tensor(f"out.{name}", t, contiguous=False)
    torch.ops.kdtree.tree_build_out(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, max_tree_nodes,
                                    *out)
    return out


def _as_result(out):
    if isinstance(out, (tuple, list)) and len(out) == len(_OUTPUTS):
        return TreeBuildResult(*out)
    raise TypeError(f"out: expected a TreeBuildResult (nine tensors), got {type(out).__name__}")
