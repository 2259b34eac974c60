"""Argument checks shared by the operators' CUDA and fake implementations.

They only read shapes, strides, dtypes and devices (never data), so they run unchanged on fake tensors
(sizes may be SymInts: membership is tested against tuples, never hashed) under torch.compile and never
synchronise with the GPU. Each reads a tensor's metadata once and builds a message only on failure;
every message names the argument and what was expected. The supported widths, page sizes and head shapes
come from the C library's table (_shapes.py).
"""

import ctypes
import math
import operator

import torch

from . import _shapes

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38  # the largest float32: above it a Python float may round to the C ABI's inf
supported = _shapes.get  # the C library's table of what kdtree generates


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


# Testing and benchmarking only (tests/python/test_cpu_launch_path.py, bench/python_overhead.py --cpu-stub):
# take CPU tensors for CUDA ones, so the launch path runs with the C library and torch's CUDA queries
# stubbed. Never set in use: the C library would get host pointers.
ACCEPT_CPU = False

_Tensor = torch.Tensor


def tensor(name, t, dtypes=None, ndim=None, *, contiguous=True):
    """t's shape, after checking that t is a tensor of one of `dtypes` with `ndim` dimensions (an int, a
    tuple of allowed counts, or None) and, unless contiguous=False, contiguous."""
    if type(t) is not _Tensor and not isinstance(t, _Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    s = t.shape
    if dtypes is not None and t.dtype not in dtypes:
        want = " or ".join(_dtype_name(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {_dtype_name(t.dtype)}")
    if ndim is not None and len(s) != ndim and (type(ndim) is int or len(s) not in ndim):
        want = ndim if type(ndim) is int else " or ".join(str(n) for n in ndim)
        raise ValueError(f"{name}: expected {want} dimensions, got shape {tuple(s)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got shape {tuple(s)} with strides "
                         f"{tuple(t.stride())} (call .contiguous())")
    return s


def shape(name, actual, expected):
    """actual: a tensor's shape; expected: a tuple of ints (or None for any). Names the expected shape."""
    if len(actual) == len(expected):
        for a, e in zip(actual, expected):
            if e is not None and a != e:
                break
        else:
            return
    want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    raise ValueError(f"{name}: expected shape {want}, got {list(actual)}")


_DEVICES = {}  # CUDA index -> torch.device, so the hot path does not build device objects


def cuda_device(index):
    d = _DEVICES.get(index)
    if d is None:
        d = _DEVICES[index] = torch.device("cuda", index)
    return d


def device_index(named, require_cuda=True):
    """The CUDA device index all tensors are on (-1: the CPU, for ACCEPT_CPU only); named: (name, tensor or
    None) pairs. Without require_cuda (the fake implementations): -1, once the tensors share a device
    (fake tensors carry the device the real ones will be on)."""
    first = first_name = None
    index = -1
    for name, t in named:
        if t is None:
            continue
        if first is None:
            if require_cuda and not t.is_cuda and not (ACCEPT_CPU and t.device.type == "cpu"):
                raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
            first, first_name, index = t, name, t.get_device()
        elif t.get_device() != index or t.is_cuda is not first.is_cuda or t.device.type != first.device.type:
            if require_cuda and not t.is_cuda and not (ACCEPT_CPU and t.device.type == "cpu"):
                raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
            raise ValueError(f"{name}: on {t.device}, but {first_name} is on {first.device}; all tensors must "
                             f"be on one device")
    return index if require_cuda else -1


def one_of(name, value, allowed, what):
    if value not in allowed:
        raise ValueError(f"{name}: {value} is not a {what} kdtree generates (supported: "
                         f"{', '.join(str(a) for a in allowed)})")


def width(name, value):
    one_of(name, value, supported().widths, "tree width")


def page_size(name, value):
    one_of(name, value, supported().page_sizes, "page size")


def integer(name, value):
    """value as an int (Python or NumPy integers; not bool, float or tensors)."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None


def float32(value):
    """value as the C ABI's float carries it (a Python float is a double: 1e-50 is 0, 1e39 is inf)."""
    return ctypes.c_float(value).value


def positive_float32(name, value, what=""):
    """A scale the C ABI takes as a float: finite and > 0 there, as well as here."""
    v32 = float32(value) if math.isfinite(value) else value
    if not (math.isfinite(v32) and v32 > 0):
        held = "" if v32 == value or not math.isfinite(value) else f" (as float32, the C ABI's type: {v32})"
        raise ValueError(f"{name}: expected a finite value > 0{what}, got {value}{held}")


def int32_range(name, value, lo=0):
    if value < lo or value > INT32_MAX:
        raise ValueError(f"{name}: {value} is out of range [{lo}, {INT32_MAX}]")


def mask_words(max_tree_nodes):
    return (max_tree_nodes + 63) // 64
