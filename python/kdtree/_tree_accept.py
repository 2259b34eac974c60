"""tree_accept: the accepted path through the draft tree, as torch.ops.kdtree.tree_accept."""

import ctypes
from typing import Optional, Tuple

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import use_eager_path


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


def _run(tokens, parents, node_counts, target_tokens, node_indptr):
    batch, w, device = plan(tokens, parents, node_counts, target_tokens, node_indptr)
    path = torch.empty((batch, w), dtype=torch.int32, device=device)
    lens = torch.empty((batch,), dtype=torch.int32, device=device)
    bonus = torch.empty((batch,), dtype=torch.int32, device=device)
    if batch == 0:
        return path, lens, bonus
    index = device.index
    with _launch.device_guard(index):
        a = _lib.TreeAcceptArgs()
        a.batch_size, a.max_tree_nodes = batch, w
        a.tokens, a.parents, a.node_counts = tokens.data_ptr(), parents.data_ptr(), node_counts.data_ptr()
        a.target_tokens = target_tokens.data_ptr()
        a.node_indptr = None if node_indptr is None else node_indptr.data_ptr()
        # Packed targets: the kernel bounds its reads by the packed length (no host sync: a shape).
        a.total_nodes = 0 if node_indptr is None else target_tokens.shape[0]
        a.accepted_path, a.accept_lens, a.bonus_tokens = path.data_ptr(), lens.data_ptr(), bonus.data_ptr()
        a.stream = _launch.current_stream(index)
        # Packed targets: the kernel bounds its reads by total_nodes (node_indptr stays on the device).
        a.total_nodes = target_tokens.shape[0] if node_indptr is not None else 0
        _lib.check(_lib.api.tree_accept(_launch.runtime(index), ctypes.byref(a)), "kdtree_tree_accept")
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
    args = (tokens, parents, node_counts, target_tokens, node_indptr)
    if use_eager_path(tokens):
        return _run(*args)
    return tuple(torch.ops.kdtree.tree_accept(*args))
