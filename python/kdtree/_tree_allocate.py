"""tree_allocate: a round's draft nodes allocated over the batch, as torch.ops.kdtree.tree_allocate."""

import math
import numbers
from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

MAX_BATCH = 2048  # the kernel's one CTA holds this many requests (kdtree.h)
_F32_MAX = C.FLOAT32_MAX  # an urgency above it may round to inf
_T = torch.Tensor


class Plan(NamedTuple):
    """What a launch depends on besides addresses, the stream and urgency."""
    batch_size: int
    max_tree_nodes: int
    cap: int
    total: int
    device: int  # CUDA index (-1: the CPU tests, or a fake implementation)


def check(scores, total, cap, active, remaining, urgency, require_cuda=True):
    """The Plan of these arguments; raises TypeError/ValueError naming the argument that is wrong."""
    batch, w = C.tensor("scores", scores, (torch.float32,), 2)
    C.width("scores.shape[1] (max_tree_nodes)", w)
    if not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"scores: expected 1..{MAX_BATCH} requests (rows), got shape {[batch, w]}")
    cap, total = C.integer("cap", cap), C.integer("total", total)
    if not 1 <= cap < w:
        raise ValueError(f"cap: expected 1..{w - 1} (the trees' width {w} less the root), got {cap}")
    if not 0 <= total <= batch * cap:
        raise ValueError(f"total: expected 0..{batch * cap} (batch {batch} x cap {cap}), got {total}")
    if active is not None:
        C.shape("active", C.tensor("active", active, (torch.bool,), 1), (batch,))
    if remaining is not None:
        C.shape("remaining", C.tensor("remaining", remaining, (torch.int32,), 1), (batch,))
    if not (math.isfinite(urgency) and urgency >= 0 and math.isfinite(C.float32(urgency))):
        raise ValueError(f"urgency: expected a finite value >= 0, got {urgency}")
    index = C.device_index((("scores", scores), ("active", active), ("remaining", remaining)), require_cuda)
    return Plan(batch, w, cap, total, index)


def _make_launch(p):
    a = _lib.TreeAllocateArgs()
    a.batch_size, a.max_tree_nodes, a.cap, a.total = p.batch_size, p.max_tree_nodes, p.cap, p.total
    return _launch.Launch(p, p.device, a)


_launches = _launch.Launches(_make_launch)
_cache = PlanCache()  # (scalars, tensors) -> Launch
_ONE = (1,)
_INT32, _INT64 = torch.int32, torch.int64


def _run(scores, total, cap, active=None, remaining=None, urgency=0.0):  # defaults: the schema's
    if active is None:
        tensors = (scores,) if remaining is None else (scores, remaining)
    else:
        tensors = (scores, active) if remaining is None else (scores, active, remaining)
    scalars = (total, type(total), cap, type(cap), active is None, remaining is None)  # 3.0 == 3: types too
    e = _cache.find(scalars, tensors)
    if e is None or not 0.0 <= urgency <= _F32_MAX:  # not seen lately, or an urgency to check (NaN, inf, past float32)
        e = _launches.get(check(scores, total, cap, active, remaining, urgency))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # outputs are allocated on, and kdtree runs with, the current device
            return _run(scores, total, cap, active, remaining, urgency)
    p = e.plan
    rows = p.batch_size + p.total
    empty = e.empty
    counts, indptr = empty((p.batch_size,), _ONE, _INT32), empty((p.batch_size + 1,), _ONE, _INT32)
    row_req, row_node = empty((rows,), _ONE, _INT64), empty((rows,), _ONE, _INT64)
    a = e.args()
    a.scores = scores.data_ptr()
    a.active = None if active is None else active.data_ptr()
    a.remaining = None if remaining is None else remaining.data_ptr()
    a.urgency = urgency
    a.node_counts, a.node_indptr = counts.data_ptr(), indptr.data_ptr()
    a.row_req, a.row_node = row_req.data_ptr(), row_node.data_ptr()
    a.stream = _launch.current_stream(index)
    status = _lib.api.tree_allocate(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_tree_allocate")
    return counts, indptr, row_req, row_node


lib.define("tree_allocate(Tensor scores, int total, int cap, Tensor? active=None, Tensor? remaining=None, "
           "float urgency=0.0) -> (Tensor, Tensor, Tensor, Tensor)")
lib.impl("tree_allocate", _run, "CUDA")
lib.impl("tree_allocate", _run, "CPU")  # only to reach the checks ('expected a CUDA tensor'); the CPU tests


@torch.library.register_fake("kdtree::tree_allocate", lib=lib)
def _(scores, total, cap, active=None, remaining=None, urgency=0.0):
    p = check(scores, total, cap, active, remaining, urgency, require_cuda=False)
    b, rows = p.batch_size, p.batch_size + p.total
    return (scores.new_empty((b,), dtype=_INT32), scores.new_empty((b + 1,), dtype=_INT32),
            scores.new_empty((rows,), dtype=_INT64), scores.new_empty((rows,), dtype=_INT64))


def tree_allocate(scores, *, total, cap, active=None, remaining=None, urgency=0.0):
    """The `total` draft nodes of highest value over the batch's trees, at most `cap` per request, in one
    launch (kdtree.integrations.allocate.allocate's choice, exactly; see kdtree.h).

    scores [B, W] float32: tree_build's scores of trees built at budget >= cap (non-increasing along nodes
    1..cap); active [B] bool (optional): requests not decoding take nodes after every decoding one;
    remaining [B] int32 (optional): tokens each request has left, weighting its nodes by
    urgency x ln(max(remaining, 1) / the batch's most). Returns (node_counts [B] int32: 1 + each request's
    draft nodes; node_indptr [B + 1] int32; row_req, row_node [B + total] int64: the request and node of
    each packed row). Scores that are NaN or increase along a request's nodes 1..cap make every request keep
    its root only (the kernel's KDTREE_DEVICE_ERROR_SCORES; the C ABI's error word is not passed from here).
    """
    if type(urgency) is not float:
        if isinstance(urgency, (bool, str, bytes, torch.Tensor)) or not isinstance(urgency, numbers.Real):
            raise TypeError(f"urgency: expected a float, got {type(urgency).__name__}")
        urgency = float(urgency)
    if type(scores) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(scores, total, cap, active, remaining, urgency)
    C.tensor("scores", scores, contiguous=False)
    for name, t in (("active", active), ("remaining", remaining)):
        if t is not None:
            C.tensor(name, t, contiguous=False)
    return tuple(torch.ops.kdtree.tree_allocate(scores, C.integer("total", total), C.integer("cap", cap), active,
                                                remaining, urgency))
