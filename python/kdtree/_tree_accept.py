"""tree_accept: the accepted path through the draft tree, as torch.ops.kdtree.tree_accept."""

from typing import Optional, Tuple

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._plan_cache import PlanCache


def plan(tokens, parents, node_counts, target_tokens, node_indptr, require_cuda=True):
    C.tensor("tokens", tokens, dtypes=(torch.int32,), ndim=2)
    C.contiguous("tokens", tokens)
    batch, w = tokens.shape
    C.one_of("tokens.shape[1] (max_tree_nodes)", w, C.TREE_WIDTHS, "tree width")
    C.tensor("parents", parents, dtypes=(torch.int32,), ndim=2)
    C.shape("parents", parents, (batch, w))
    C.contiguous("parents", parents)
    C.tensor("node_counts", node_counts, dtypes=(torch.int32,), ndim=1)
    C.shape("node_counts", node_counts, (batch,))
    C.contiguous("node_counts", node_counts)
    C.tensor("target_tokens", target_tokens, dtypes=(torch.int32,))
    if node_indptr is None:
        if target_tokens.dim() != 2:
            raise ValueError(f"target_tokens: expected the padded layout [{batch}, {w}] (or pass node_indptr "
                             f"for the packed [total_nodes] layout), got shape {list(target_tokens.shape)}")
        C.shape("target_tokens", target_tokens, (batch, w))
    else:
        C.tensor("node_indptr", node_indptr, dtypes=(torch.int32,), ndim=1)
        C.shape("node_indptr", node_indptr, (batch + 1,))
        C.contiguous("node_indptr", node_indptr)
        if target_tokens.dim() != 1:
            raise ValueError(f"target_tokens: with node_indptr, expected the packed layout [total_nodes], got "
                             f"shape {list(target_tokens.shape)}")
        if not batch <= target_tokens.shape[0] <= batch * w:
            raise ValueError(f"target_tokens: {target_tokens.shape[0]} packed nodes for {batch} requests; each "
                             f"request has 1..max_tree_nodes = {w} nodes")
    C.contiguous("target_tokens", target_tokens)
    named = [("tokens", tokens), ("parents", parents), ("node_counts", node_counts),
             ("target_tokens", target_tokens), ("node_indptr", node_indptr)]
    device = C.same_device(named) if require_cuda else tokens.device
    return batch, w, device


_T = torch.Tensor
_I32 = torch.int32
_WIDTH_SET = frozenset(C.TREE_WIDTHS)
_Args = _lib.TreeAcceptArgs
_ONE = (1,)


def _fast_plan(tokens, parents, node_counts, target_tokens, node_indptr):
    """The common case in one pass of cheap tests: (batch, W, total_nodes, device index), or None; then
    plan() (the authority, which names what is wrong) decides. Accepts nothing that plan() rejects."""
    if (type(tokens) is not _T or type(parents) is not _T or type(node_counts) is not _T
            or type(target_tokens) is not _T):
        return None
    ts = tokens.shape
    if (len(ts) != 2 or tokens.dtype is not _I32 or parents.dtype is not _I32 or node_counts.dtype is not _I32
            or target_tokens.dtype is not _I32 or parents.shape != ts or not tokens.is_contiguous()
            or not parents.is_contiguous() or not node_counts.is_contiguous() or not target_tokens.is_contiguous()):
        return None
    b, w = ts
    if w not in _WIDTH_SET or node_counts.shape != (b,):
        return None
    if node_indptr is None:
        if target_tokens.shape != ts:
            return None
        total = 0
    else:
        tt = target_tokens.shape
        if (type(node_indptr) is not _T or node_indptr.dtype is not _I32 or node_indptr.shape != (b + 1,)
                or not node_indptr.is_contiguous() or len(tt) != 1 or not b <= tt[0] <= b * w):
            return None
        total = tt[0]
    cuda = tokens.is_cuda
    if not cuda and not C.accept_cpu(tokens, parents, node_counts, target_tokens, node_indptr):
        return None
    index = tokens.get_device()
    if (parents.get_device() != index or node_counts.get_device() != index or target_tokens.get_device() != index
            or parents.is_cuda is not cuda or node_counts.is_cuda is not cuda or target_tokens.is_cuda is not cuda
            or (node_indptr is not None and (node_indptr.get_device() != index or node_indptr.is_cuda is not cuda))):
        return None
    return b, w, total, index


_cache = PlanCache()  # (scalars, tensors) -> (batch, W, total_nodes, device index, allocator)


def _run(tokens, parents, node_counts, target_tokens, node_indptr):
    if node_indptr is None:
        tensors, scalars = (tokens, parents, node_counts, target_tokens), 4
    else:
        tensors, scalars = (tokens, parents, node_counts, target_tokens, node_indptr), 5
    f = _cache.find(scalars, tensors)
    if f is None:  # not seen lately: the quick test, else the full checks (which name what is wrong)
        f = _fast_plan(tokens, parents, node_counts, target_tokens, node_indptr)
        if f is None:
            batch, w, device = plan(tokens, parents, node_counts, target_tokens, node_indptr)
            f = (batch, w, 0 if node_indptr is None else target_tokens.shape[0],
                 C.device_index(device))
        f += (_launch.empty_fn(f[3]),)
        _cache.add(scalars, tensors, f)
    batch, w, total, index, empty = f
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(tokens, parents, node_counts, target_tokens, node_indptr)
    path, lens, bonus = empty((batch, w), (w, 1), _I32), empty((batch,), _ONE, _I32), empty((batch,), _ONE, _I32)
    if batch == 0:
        return path, lens, bonus
    a = _Args()
    a.batch_size, a.max_tree_nodes = batch, w
    a.tokens, a.parents, a.node_counts = tokens.data_ptr(), parents.data_ptr(), node_counts.data_ptr()
    a.target_tokens = target_tokens.data_ptr()
    if node_indptr is not None:
        a.node_indptr = node_indptr.data_ptr()
        a.total_nodes = total  # packed targets: the kernel bounds its reads by it (a shape: no host sync)
    a.accepted_path, a.accept_lens, a.bonus_tokens = path.data_ptr(), lens.data_ptr(), bonus.data_ptr()
    a.stream = _launch.current_stream(index)
    status = _launch.call(_lib.api.tree_accept, index, a)
    if status:
        _lib.check(status, "kdtree_tree_accept")
    return path, lens, bonus


@torch.library.custom_op("kdtree::tree_accept", mutates_args=())
def tree_accept_op(tokens: torch.Tensor, parents: torch.Tensor, node_counts: torch.Tensor,
                   target_tokens: torch.Tensor, node_indptr: Optional[torch.Tensor] = None
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _run(tokens, parents, node_counts, target_tokens, node_indptr)


@tree_accept_op.register_fake
def _(tokens, parents, node_counts, target_tokens, node_indptr=None):
    batch, w, _ = plan(tokens, parents, node_counts, target_tokens, node_indptr, require_cuda=False)
    return (tokens.new_empty((batch, w)), tokens.new_empty((batch,)), tokens.new_empty((batch,)))


def tree_accept(tokens, parents, node_counts, target_tokens, *, node_indptr=None):
    """Follows the target model's tokens down each request's tree (tree_build's padded layout).

    tokens, parents [B, W] int32; node_counts [B] int32; target_tokens [B, W] int32 (the target's token at
    each node), or packed [total_nodes] with node_indptr [B+1]. Returns (accepted_path [B, W] int32: node
    ids, root first, -1 padded; accept_lens [B] int32: accepted draft tokens = path length - 1;
    bonus_tokens [B] int32: the target token at the last accepted node).
    """
    if type(tokens) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(tokens, parents, node_counts, target_tokens, node_indptr)
    return tuple(torch.ops.kdtree.tree_accept(tokens, parents, node_counts, target_tokens, node_indptr))
