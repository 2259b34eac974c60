"""What every launch needs from torch: the device's runtime, torch's current stream, and workspaces.

Workspace policy (verify_attention's split-KV scratch):
  * outside CUDA-graph capture, one uint8 buffer per (device, stream), grown (never shrunk) when a call
    needs more; it is allocated on that stream, so torch's caching allocator orders its reuse after the
    kernels that used it;
  * inside capture, the buffer is allocated through torch, i.e. from the graph's private memory pool,
    which keeps it alive exactly as long as the graph. A captured graph therefore never points at the
    eager cache, which a later, larger call may free and replace. Nothing is allocated with cudaMalloc
    inside capture once torch's graph pool is warm, and no warm-up is needed for correctness.
"""

import contextlib
from threading import get_ident

import torch

from . import _runtime

try:
    current_stream = torch._C._cuda_getCurrentRawStream  # the CUstream as an int, without a Stream object
except AttributeError:  # pragma: no cover - older torch
    def current_stream(index):
        return torch.cuda.current_stream(index).cuda_stream


try:
    capturing = torch._C._cuda_isCurrentStreamCapturing
except AttributeError:  # pragma: no cover - older torch
    capturing = torch.cuda.is_current_stream_capturing

try:
    _get_device = torch._C._cuda_getDevice  # without torch.cuda.current_device()'s lazy-init check
except AttributeError:  # pragma: no cover - older torch
    _get_device = torch.cuda.current_device

_SAME_DEVICE = contextlib.nullcontext()  # reusable: entering it does nothing


def device_guard(index):
    """Makes `index` torch's current device for the launch when it is not already (kdtree then finds the
    device's primary context current and leaves it, so torch's view of the current device stays right)."""
    if _get_device() == index:
        return _SAME_DEVICE
    return torch.cuda.device(index)


runtime = _runtime.get  # the device's runtime (module attribute: the CPU tests replace it)


class Launch:
    """What the calls of one plan share: the plan (a NamedTuple of sizes), its CUDA device index, the output
    allocator, and the C argument struct with the plan's sizes filled in. A call sets every pointer field
    and the stream (and any per-call scalar), so the struct is reused rather than built per call: by the
    thread that made it; any other thread gets a copy, so no two threads ever fill one struct."""
    __slots__ = ("plan", "index", "empty", "_args", "_template", "_thread", "extra")

    def __init__(self, plan, index, args, extra=None):
        self.plan, self.index, self.empty, self.extra = plan, index, empty_fn(index), extra
        self._args, self._template, self._thread = args, bytes(args), get_ident()

    def args(self):
        if get_ident() == self._thread:
            return self._args
        return type(self._args).from_buffer_copy(self._template)


class Launches:
    """plan -> Launch, bounded (cleared when full: a caller whose sizes never repeat builds a Launch per
    call, as it would without the cache)."""
    __slots__ = ("_entries", "_make")
    SIZE = 256

    def __init__(self, make):
        self._entries, self._make = {}, make

    def get(self, plan):
        e = self._entries.get(plan)
        if e is None:
            e = self._make(plan)
            if len(self._entries) >= self.SIZE:
                self._entries.clear()
            self._entries[plan] = e
        return e

    def clear(self):
        self._entries.clear()


def _torch_empty(device):
    def empty(shape, stride, dtype):
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)
    return empty


def _fast_empties():
    """torch's allocation entry points without argument parsing and dispatch (those of compiled graphs,
    ~1.5 us less per tensor), if this torch has them and they behave; else None."""
    try:
        from torch._C._dynamo.guards import _empty_strided_cpu, _empty_strided_cuda
        t = _empty_strided_cpu((2, 3), (1, 2), torch.int32)  # the CUDA one parses its arguments alike
        if tuple(t.shape) == (2, 3) and t.stride() == (1, 2) and t.dtype is torch.int32 and not t.requires_grad:
            return _empty_strided_cpu, _empty_strided_cuda
    except Exception:  # noqa: BLE001 - private to torch: any failure means do without
        pass
    return None


_EMPTIES = _fast_empties()


def empty_fn(index):
    """f(shape, stride, dtype): an uninitialised tensor on CUDA device `index`, which must be torch's current
    device when f is called (-1: the CPU, for _checks.ACCEPT_CPU only)."""
    if _EMPTIES is None:
        return _torch_empty("cuda" if index >= 0 else "cpu")
    return _EMPTIES[1] if index >= 0 else _EMPTIES[0]


_workspaces = {}  # (device index, stream) -> uint8 tensor


def workspace(index, stream, nbytes):
    """A buffer of at least nbytes on CUDA device `index` (-1: the CPU, for _checks.ACCEPT_CPU only) for a
    launch on `stream` (see the module docstring)."""
    if nbytes == 0:
        return None
    device = f"cuda:{index}" if index >= 0 else "cpu"
    if capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    key = (index, stream)
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < nbytes:
        # Grow with headroom so slowly rising lengths do not reallocate on every call.
        size = max(nbytes, 0 if ws is None else ws.numel() * 3 // 2)
        _workspaces.pop(key, None)
        ws = torch.empty(size, dtype=torch.uint8, device=device)
        _workspaces[key] = ws
    return ws
