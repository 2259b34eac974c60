"""sample_tokens: one token per logits row (greedy or seeded temperature sampling), as torch.ops.kdtree.sample_tokens."""

import math
from typing import Optional

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import _dispatch_stack_len, _is_compiling
from ._plan_cache import PlanCache

_DTYPES = {torch.bfloat16: _lib.DTYPE_BF16, torch.float32: _lib.DTYPE_F32}
_U64 = 2**64


def plan(logits, temperature, row_offsets, require_cuda=True):
    C.tensor("logits", logits, dtypes=tuple(_DTYPES), ndim=2)
    rows, vocab = logits.shape
    if vocab < 1:
        raise ValueError("logits: expected at least one column (vocab size >= 1), got shape "
                         f"{list(logits.shape)}")
    C.int32_range("logits.shape[1] (vocab size)", vocab, lo=1)
    C.int32_range("logits.shape[0] (rows)", rows)
    if logits.stride(1) != 1 or (rows > 1 and logits.stride(0) < vocab):
        raise ValueError(f"logits: expected unit stride along the vocabulary and a row stride >= {vocab}, got "
                         f"strides {tuple(logits.stride())}")
    if not math.isfinite(temperature):
        raise ValueError(f"temperature: expected a finite value, got {temperature}")
    if row_offsets is not None:
        C.tensor("row_offsets", row_offsets, dtypes=(torch.int64,), ndim=1)
        C.shape("row_offsets", row_offsets, (rows,))
        C.contiguous("row_offsets", row_offsets)
    device = C.same_device([("logits", logits), ("row_offsets", row_offsets)]) if require_cuda else logits.device
    return rows, vocab, device


_T = torch.Tensor
_BF16, _F32, _I32, _I64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
_Args = _lib.SampleArgs
_ONE = (1,)


def _fast_plan(logits, temperature, row_offsets):
    """The common case in one pass of cheap tests: (rows, vocab, row stride, dtype code, device index), or
    None; then plan() (the authority, which names what is wrong) decides. Accepts nothing plan() rejects."""
    if type(logits) is not _T:
        return None
    dtype = logits.dtype
    ls = logits.shape
    if (dtype is not _BF16 and dtype is not _F32) or len(ls) != 2:
        return None
    rows, vocab = ls
    st = logits.stride()
    if (not 1 <= vocab <= C.INT32_MAX or rows > C.INT32_MAX or st[1] != 1 or (rows > 1 and st[0] < vocab)
            or not -math.inf < temperature < math.inf):
        return None
    cuda = logits.is_cuda
    if not cuda and not C.accept_cpu(logits, row_offsets if type(row_offsets) is _T else None):
        return None
    index = logits.get_device()
    if row_offsets is not None and (type(row_offsets) is not _T or row_offsets.dtype is not _I64
                                    or row_offsets.shape != (rows,) or not row_offsets.is_contiguous()
                                    or row_offsets.get_device() != index or row_offsets.is_cuda is not cuda):
        return None
    return rows, vocab, st[0] if rows > 1 else vocab, _lib.DTYPE_BF16 if dtype is _BF16 else _lib.DTYPE_F32, index


_cache = PlanCache()  # (scalars, tensors) -> (rows, vocab, row stride, dtype code, device index, allocator)


def _run(logits, temperature, seed, row_offsets):
    """temperature: a float; seed: an int in [-2**63, 2**63) (the operator's int64)."""
    if row_offsets is None:
        tensors, scalars = (logits,), 1
    else:
        tensors, scalars = (logits, row_offsets), 2
    f = _cache.find(scalars, tensors)
    if f is None or not -math.inf < temperature < math.inf:  # not seen lately, or a temperature to reject:
        # the quick test, else the full checks (which name what is wrong)
        f = _fast_plan(logits, temperature, row_offsets)
        if f is None:
            rows, vocab, device = plan(logits, temperature, row_offsets)
            f = (rows, vocab, logits.stride(0) if rows > 1 else vocab, _DTYPES[logits.dtype],
                 C.device_index(device))
        f += (_launch.empty_fn(f[4]),)
        _cache.add(scalars, tensors, f)
    rows, vocab, row_stride, code, index, empty = f
    if _launch._get_device() != index:
        with torch.cuda.device(index):  # the output is allocated on, and kdtree runs with, the current device
            return _run(logits, temperature, seed, row_offsets)
    out = empty((rows,), _ONE, _I32)
    if rows == 0:
        return out
    a = _Args()
    a.num_rows, a.vocab_size, a.logits_dtype, a.logits, a.row_stride = rows, vocab, code, logits.data_ptr(), row_stride
    a.temperature = temperature
    a.seed = seed % _U64  # the operator carries it as a signed int64
    if row_offsets is not None:
        a.row_offsets = row_offsets.data_ptr()
    a.out_tokens = out.data_ptr()
    a.stream = _launch.current_stream(index)
    status = _launch.call(_lib.api.sample_tokens, index, a)
    if status:
        _lib.check(status, "kdtree_sample_tokens")
    return out


@torch.library.custom_op("kdtree::sample_tokens", mutates_args=())
def sample_tokens_op(logits: torch.Tensor, temperature: float = 0.0, seed: int = 0,
                     row_offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The operator; seed is an int64 here (values >= 2**63 arrive as their two's-complement)."""
    return _run(logits, temperature, seed, row_offsets)


@sample_tokens_op.register_fake
def _(logits, temperature=0.0, seed=0, row_offsets=None):
    rows, _, _ = plan(logits, temperature, row_offsets, require_cuda=False)
    return logits.new_empty((rows,), dtype=torch.int32)


def sample_tokens(logits, *, temperature=0.0, seed=0, row_offsets=None):
    """The token of each logits row: argmax (lowest index on ties) when temperature <= 0, else a sample
    from softmax(logits / temperature) drawn with the counter-based RNG keyed by (seed, row offset).

    logits [N, V] bf16 or float32 (unit stride along V; the row stride may exceed V); seed in [0, 2**64);
    row_offsets [N] int64 (default: the row index). Returns tokens [N] int32.
    """
    if not 0 <= seed < _U64:
        raise ValueError(f"seed: expected an integer in [0, 2**64), got {seed}")
    signed_seed = seed - _U64 if seed >= 2**63 else seed
    if type(logits) is _T and not _is_compiling() and not _dispatch_stack_len():  # see _dispatch.py
        return _run(logits, float(temperature), signed_seed, row_offsets)
    return torch.ops.kdtree.sample_tokens(logits, float(temperature), signed_seed, row_offsets)
