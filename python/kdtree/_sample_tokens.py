"""sample_tokens: one token per logits row (greedy or seeded temperature sampling), as torch.ops.kdtree.sample_tokens."""

import math
from typing import NamedTuple
from ctypes import byref as _byref

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._ops import lib
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float32: _lib.DTYPE_F32}  # logits (not in the shape table)
_DTYPE_KEYS = tuple(_DTYPES)
_U64 = 2**64
_INF = math.inf
_F32_MAX = C.FLOAT32_MAX  # a temperature above it may round to inf


class Plan(NamedTuple):
    """What a launch depends on besides addresses, the stream, temperature and seed."""
    num_rows: int
    vocab_size: int
    row_stride: int  # elements between rows
    dtype: int       # kdtree_dtype of the logits
    device: int      # CUDA index (-1: the CPU tests, or a fake implementation)


def check(logits, temperature, row_offsets, require_cuda=True):
    """The Plan of these arguments; raises TypeError/ValueError naming the argument that is wrong."""
    s = C.tensor("logits", logits, _DTYPE_KEYS, 2, contiguous=False)
    rows, vocab = s
    if vocab < 1:
        raise ValueError(f"logits: expected at least one column (vocab size >= 1), got shape {list(s)}")
    C.int32_range("logits.shape[1] (vocab size)", vocab, lo=1)
    C.int32_range("logits.shape[0] (rows)", rows)
    st = logits.stride()
    if st[1] != 1 or (rows > 1 and st[0] < vocab):
        raise ValueError(f"logits: expected unit stride along the vocabulary and a row stride >= {vocab}, got "
                         f"strides {tuple(st)}")
    if math.isnan(temperature) or C.float32(temperature) == _INF:
        raise ValueError(f"temperature: expected a finite value within float32's range (the C ABI takes a float; "
                         f"<= 0, -inf too, means greedy), got {temperature}")
    if row_offsets is not None:
        C.shape("row_offsets", C.tensor("row_offsets", row_offsets, (torch.int64,), 1), (rows,))
    index = C.device_index((("logits", logits), ("row_offsets", row_offsets)), require_cuda)
    return Plan(rows, vocab, st[0] if rows > 1 else vocab, _DTYPES[logits.dtype], index)


def _make_launch(p):
    a = _lib.SampleArgs()
    a.num_rows, a.vocab_size, a.logits_dtype, a.row_stride = p.num_rows, p.vocab_size, p.dtype, p.row_stride
    return _launch.Launch(p, p.device, a)


_launches = _launch.Launches(_make_launch)
_cache = PlanCache()  # (scalars, tensors) -> Launch
_ONE = (1,)
_INT32 = torch.int32


def _run(logits, temperature=0.0, seed=0, row_offsets=None):  # defaults: the schema's (the dispatcher omits them)
    """temperature: a float; seed: an int in [-2**63, 2**63) (the operator's int64)."""
    if row_offsets is None:
        tensors, scalars = (logits,), 1
    else:
        tensors, scalars = (logits, row_offsets), 2
    e = _cache.find(scalars, tensors)
    if e is None or not temperature <= _F32_MAX:  # not seen lately, or a temperature to check (NaN, float32's inf)
        e = _launches.get(check(logits, temperature, row_offsets))
        _cache.add(scalars, tensors, e)
    index = e.index
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # the output is allocated on, and kdtree runs with, the current device
            return _run(logits, temperature, seed, row_offsets)
    rows = e.plan.num_rows
    out = e.empty((rows,), _ONE, _INT32)
    if rows == 0:
        return out
    a = e.args()
    a.logits, a.temperature, a.seed = logits.data_ptr(), temperature, seed % _U64  # the operator's seed is signed
    a.row_offsets = None if row_offsets is None else row_offsets.data_ptr()
    a.out_tokens, a.stream = out.data_ptr(), _launch.current_stream(index)
    status = _lib.api.sample_tokens(_launch.runtime(index), _byref(a))  # index is the current device (above)
    if status:
        _lib.check(status, "kdtree_sample_tokens")
    return out


# seed is an int64 here (values >= 2**63 arrive as their two's-complement).
lib.define("sample_tokens(Tensor logits, float temperature=0.0, int seed=0, Tensor? row_offsets=None) -> Tensor")
lib.impl("sample_tokens", _run, "CUDA")
lib.impl("sample_tokens", _run, "CPU")  # only to reach the checks ('expected a CUDA tensor'); the CPU tests


@torch.library.register_fake("kdtree::sample_tokens", lib=lib)
def _(logits, temperature=0.0, seed=0, row_offsets=None):
    p = check(logits, temperature, row_offsets, require_cuda=False)
    return logits.new_empty((p.num_rows,), dtype=torch.int32)


_T = torch.Tensor


def sample_tokens(logits, *, temperature=0.0, seed=0, row_offsets=None):
    """The token of each logits row: argmax (lowest index on ties) when temperature <= 0, else a sample
    from softmax(logits / temperature) drawn with the counter-based RNG keyed by (seed, row offset).

    logits [N, V] bf16 or float32 (unit stride along V; the row stride may exceed V); seed in [0, 2**64);
    row_offsets [N] int64 (default: the row index). Returns tokens [N] int32.
    """
    if type(seed) is not int:
        seed = C.integer("seed", seed)
    if not 0 <= seed < _U64:
        raise ValueError(f"seed: expected an integer in [0, 2**64), got {seed}")
    signed_seed = seed - _U64 if seed >= 2**63 else seed
    if type(temperature) is not float:
        try:
            temperature = float(temperature)
        except (TypeError, ValueError):
            raise TypeError(f"temperature: expected a float, got {type(temperature).__name__}") from None
    if type(logits) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(logits, temperature, signed_seed, row_offsets)
    # torch's dispatcher would reject a non-tensor without naming it: check here.
    C.tensor("logits", logits, contiguous=False)
    if row_offsets is not None:
        C.tensor("row_offsets", row_offsets, contiguous=False)
    return torch.ops.kdtree.sample_tokens(logits, temperature, signed_seed, row_offsets)
