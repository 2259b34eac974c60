"""tree_accept: the accepted path through the draft tree, as torch.ops.kdtree.tree_accept."""

from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

_I32 = (torch.int32,)
_T = torch.Tensor


class Plan(NamedTuple):
    """What a launch depends on besides addresses and the stream."""
    batch_size: int
    max_tree_nodes: int
    total_nodes: int  # packed target_tokens' length; 0 for the padded layout
    device: int       # CUDA index (-1: the CPU tests, or a fake implementation)


def check(tokens, parents, node_counts, target_tokens, node_indptr, require_cuda=True):
    """The Plan of these arguments; raises TypeError/ValueError naming the argument that is wrong."""
    ts = C.tensor("tokens", tokens, _I32, 2)
    batch, w = ts
    C.width("tokens.shape[1] (max_tree_nodes)", w)
    ps = C.tensor("parents", parents, _I32, 2)
    if ps != ts:
        C.shape("parents", ps, (batch, w))
    C.shape("node_counts", C.tensor("node_counts", node_counts, _I32, 1), (batch,))
    tt = C.tensor("target_tokens", target_tokens, _I32, contiguous=False)
    if node_indptr is None:
        if len(tt) != 2:
            raise ValueError(f"target_tokens: expected the padded layout [{batch}, {w}] (or pass node_indptr "
                             f"for the packed [total_nodes] layout), got shape {list(tt)}")
        C.shape("target_tokens", tt, (batch, w))
        total = 0
    else:
        C.shape("node_indptr", C.tensor("node_indptr", node_indptr, _I32, 1), (batch + 1,))
        if len(tt) != 1:
            raise ValueError(f"target_tokens: with node_indptr, expected the packed layout [total_nodes], got "
                             f"shape {list(tt)}")
        total = tt[0]
        if not batch <= total <= batch * w:
            raise ValueError(f"target_tokens: {total} packed nodes for {batch} requests; each request has "
                             f"1..max_tree_nodes = {w} nodes")
    C.tensor("target_tokens", target_tokens)  # contiguity, after the layout checks
    index = C.device_index((("tokens", tokens), ("parents", parents), ("node_counts", node_counts),
                            ("target_tokens", target_tokens), ("node_indptr", node_indptr)), require_cuda)
    return Plan(batch, w, total, index)


def _make_launch(p):
    a = _lib.TreeAcceptArgs()
    a.batch_size, a.max_tree_nodes, a.total_nodes = p.batch_size, p.max_tree_nodes, p.total_nodes
    return _launch.Launch(p, p.device, a)


_launches = _launch.Launches(_make_launch)
_cache = PlanCache()  # (scalars, tensors) -> Launch
_ONE = (1,)
_INT32 = torch.int32


def _run(tokens, parents, node_counts, target_tokens, node_indptr=None):  # defaults: the schema's (the dispatcher omits them)
    if node_indptr is None:
        tensors, scalars = (tokens, parents, node_counts, target_tokens), 4
    else:
        tensors, scalars = (tokens, parents, node_counts, target_tokens, node_indptr), 5
    e = _cache.find(scalars, tensors)
    if e is None:  # not seen lately: check and plan
        e = _launches.get(check(tokens, parents, node_counts, target_tokens, node_indptr))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(tokens, parents, node_counts, target_tokens, node_indptr)
    batch, w = e.plan.batch_size, e.plan.max_tree_nodes
    empty = e.empty
    path, lens, bonus = empty((batch, w), (w, 1), _INT32), empty((batch,), _ONE, _INT32), empty((batch,), _ONE, _INT32)
    if batch == 0:
        return path, lens, bonus
    a = e.args()
    a.tokens, a.parents, a.node_counts = tokens.data_ptr(), parents.data_ptr(), node_counts.data_ptr()
    # packed targets: the kernel bounds its reads by total_nodes (in the plan: a shape, so no host sync)
    a.target_tokens, a.node_indptr = target_tokens.data_ptr(), None if node_indptr is None else node_indptr.data_ptr()
    a.accepted_path, a.accept_lens, a.bonus_tokens = path.data_ptr(), lens.data_ptr(), bonus.data_ptr()
    a.stream = _launch.current_stream(index)
    status = _lib.api.tree_accept(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_tree_accept")
    return path, lens, bonus


lib.define("tree_accept(Tensor tokens, Tensor parents, Tensor node_counts, Tensor target_tokens, "
           "Tensor? node_indptr=None) -> (Tensor, Tensor, Tensor)")
lib.impl("tree_accept", _run, "CUDA")
lib.impl("tree_accept", _run, "CPU")  # only to reach the checks ('expected a CUDA tensor'); the CPU tests


@torch.library.register_fake("kdtree::tree_accept", lib=lib)
def _(tokens, parents, node_counts, target_tokens, node_indptr=None):
    p = check(tokens, parents, node_counts, target_tokens, node_indptr, require_cuda=False)
    b, w = p.batch_size, p.max_tree_nodes
    return tokens.new_empty((b, w)), tokens.new_empty((b,)), tokens.new_empty((b,))


def tree_accept(tokens, parents, node_counts, target_tokens, *, node_indptr=None):
    """Follows the target model's tokens down each request's tree (tree_build's padded layout).

    tokens, parents [B, W] int32; node_counts [B] int32; target_tokens [B, W] int32 (the target's token at
    each node), or packed [total_nodes] with node_indptr [B+1]. Returns (accepted_path [B, W] int32: node
    ids, root first, -1 padded; accept_lens [B] int32: accepted draft tokens = path length - 1;
    bonus_tokens [B] int32: the target token at the last accepted node).
    """
    if type(tokens) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(tokens, parents, node_counts, target_tokens, node_indptr)
    # torch's dispatcher would reject a non-tensor without naming it: check here.
    for name, t in (("tokens", tokens), ("parents", parents), ("node_counts", node_counts),
                    ("target_tokens", target_tokens)):
        C.tensor(name, t, contiguous=False)
    if node_indptr is not None:
        C.tensor("node_indptr", node_indptr, contiguous=False)
    return tuple(torch.ops.kdtree.tree_accept(tokens, parents, node_counts, target_tokens, node_indptr))
