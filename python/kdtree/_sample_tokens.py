"""sample_tokens: one token per logits row (greedy or seeded temperature sampling), as torch.ops.kdtree.sample_tokens."""

import ctypes
import math
from typing import Optional

import torch

from . import _checks as C
from . import _launch, _lib
from ._dispatch import use_eager_path

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


def _run(logits, temperature, seed, row_offsets):
    rows, vocab, device = plan(logits, temperature, row_offsets)
    out = torch.empty((rows,), dtype=torch.int32, device=device)
    if rows == 0:
        return out
    index = device.index
    with _launch.device_guard(index):
        a = _lib.SampleArgs()
        a.num_rows, a.vocab_size = rows, vocab
        a.logits_dtype = _DTYPES[logits.dtype]
        a.logits = logits.data_ptr()
        a.row_stride = logits.stride(0) if rows > 1 else vocab
        a.temperature = temperature
        a.seed = seed % _U64  # the operator carries it as a signed int64
        a.row_offsets = None if row_offsets is None else row_offsets.data_ptr()
        a.out_tokens = out.data_ptr()
        a.stream = _launch.current_stream(index)
        _lib.check(_lib.api.sample_tokens(_launch.runtime(index), ctypes.byref(a)), "kdtree_sample_tokens")
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
    args = (logits, float(temperature), signed_seed, row_offsets)
    if use_eager_path(logits):
        return _run(*args)
    return torch.ops.kdtree.sample_tokens(*args)
