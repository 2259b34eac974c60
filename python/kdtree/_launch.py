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
from ctypes import byref

import torch

from . import _runtime

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # the CUstream as an int, without a Stream object

    def current_stream(index):
        return _raw_stream(index)
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


def runtime(index):
    return _runtime.get(index)


def call(fn, index, args):
    """fn(runtime of device `index`, &args) with `index` torch's current device (see device_guard); the
    kdtree_status. The common case, the device already current, costs one cudaGetDevice and no context
    manager."""
    if _get_device() == index:
        return fn(runtime(index), byref(args))
    with torch.cuda.device(index):
        return fn(runtime(index), byref(args))


_workspaces = {}  # (device index, stream) -> uint8 tensor


def workspace(device, stream, nbytes):
    """A device buffer of at least nbytes for a launch on `stream` (see the module docstring)."""
    if nbytes == 0:
        return None
    if capturing():
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    key = (device.index, stream)
    ws = _workspaces.get(key)
    if ws is None or ws.numel() < nbytes:
        # Grow with headroom so slowly rising lengths do not reallocate on every call.
        size = max(nbytes, 0 if ws is None else ws.numel() * 3 // 2)
        _workspaces.pop(key, None)
        ws = torch.empty(size, dtype=torch.uint8, device=device)
        _workspaces[key] = ws
    return ws


def clear_workspaces():
    """Drops the cached eager workspaces (torch's allocator gets them back)."""
    _workspaces.clear()
