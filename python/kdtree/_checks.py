"""Argument checks shared by the operators' CUDA and fake implementations.

They only read shapes, strides, dtypes and devices (never data), so they run unchanged on fake tensors
under torch.compile and never synchronise with the GPU. Every message names the argument and what was
expected.
"""

import operator

import torch

PAGE_SIZES = (1, 16, 32, 64, 128)
TREE_WIDTHS = (16, 32, 64, 128)
GQA_HEAD_DIMS = (64, 128, 256)
MLA_HEAD_DIM_QK = 576
MLA_HEAD_DIM_V = 512
INT32_MAX = 2**31 - 1


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


# Testing and benchmarking only (tests/python/test_cpu_launch_path.py, bench/python_overhead.py --cpu-stub):
# take CPU tensors for CUDA ones, so the launch path, fast checks included, runs with the C library and
# torch's CUDA queries stubbed. Never set in use: the C library would get host pointers.
ACCEPT_CPU = False



def accept_cpu(*tensors):
    """The quick tests' device test when the first tensor is not on CUDA: all (but None) on the CPU and
    ACCEPT_CPU set."""
    return ACCEPT_CPU and all(t is None or t.device.type == "cpu" for t in tensors)


_Tensor = torch.Tensor
_DEVICES = {}  # CUDA index -> torch.device, so the hot path does not build device objects


def cuda_device(index):
    d = _DEVICES.get(index)
    if d is None:
        d = _DEVICES[index] = torch.device("cuda", index)
    return d


def device_index(d):
    """The CUDA device index of torch.device `d`, -1 for any other device (CPU tests, meta): plan keys."""
    return d.index if d.type == "cuda" else -1


# These run on every call: they read each tensor's metadata once and build messages only on failure.
def tensor(name, t, *, dtypes=None, ndim=None, ndims=None):
    if type(t) is not _Tensor and not isinstance(t, _Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        want = " or ".join(_dtype_name(d) for d in dtypes)
        raise TypeError(f"{name}: expected dtype {want}, got {_dtype_name(t.dtype)}")
    if ndim is not None and len(t.shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if ndims is not None and len(t.shape) not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name}: expected {want} dimensions, got shape {tuple(t.shape)}")
    return t


def contiguous(name, t):
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got shape {tuple(t.shape)} with strides "
                         f"{tuple(t.stride())} (call .contiguous())")


def shape(name, t, expected):
    """expected: a tuple of ints (or None for any); names the first disagreeing dimension."""
    actual = t.shape
    if len(actual) == len(expected):
        for a, e in zip(actual, expected):
            if e is not None and a != e:
                break
        else:
            return
    want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    raise ValueError(f"{name}: expected shape {want}, got {list(actual)}")


def same_device(named):
    """All tensors on one CUDA device; returns it. named: list of (name, tensor or None)."""
    first = first_name = None
    index = -1
    for name, t in named:
        if t is None:
            continue
        if first is None:
            if not t.is_cuda and not (ACCEPT_CPU and t.device.type == "cpu"):
                raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
            first, first_name, index = t, name, t.get_device()
        elif t.get_device() != index or t.device.type != first.device.type:  # CPU and meta report -1
            if not t.is_cuda and not (ACCEPT_CPU and t.device.type == "cpu"):
                raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
            raise ValueError(f"{name}: on {t.device}, but {first_name} is on {first.device}; all tensors must "
                             f"be on one device")
    return cuda_device(index) if index >= 0 else first.device


def one_of(name, value, allowed, what):
    if value not in allowed:
        raise ValueError(f"{name}: {value} is not a {what} kdtree generates (supported: "
                         f"{', '.join(str(a) for a in allowed)})")


def integer(name, value):
    """value as an int (Python or NumPy integers; not bool, float or tensors)."""
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}") from None


def int32_range(name, value, lo=0):
    if value < lo or value > INT32_MAX:
        raise ValueError(f"{name}: {value} is out of range [{lo}, {INT32_MAX}]")


def mask_words(max_tree_nodes):
    return (max_tree_nodes + 63) // 64
