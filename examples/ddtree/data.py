"""The training corpus: the Python standard library's own .py sources, as bytes (vocab 256).

Every machine with Python has them, so nothing is downloaded. Files are split by a hash of their
relative path: about 1 in 16 is held out for evaluation and for the decoding prompts.
"""
from __future__ import annotations

import sysconfig
import zlib
from pathlib import Path

import torch


def stdlib_files():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    if not files:
        raise RuntimeError(f"no Python sources under {root}: the corpus needs the standard library's .py files")
    return root, files


def load_corpus(max_bytes: int):
    """(train bytes, held-out bytes) as uint8 tensors; deterministic for a given Python install."""
    root, files = stdlib_files()
    train, held = bytearray(), bytearray()
    for p in files:
        held_out = zlib.crc32(str(p.relative_to(root)).encode()) % 16 == 0
        dest = held if held_out else train
        if len(dest) >= (max_bytes if not held_out else max_bytes // 8):
            continue
        try:
            dest += p.read_bytes() + b"\n"
        except OSError:
            continue
    if len(train) < 1 << 16 or len(held) < 1 << 14:
        raise RuntimeError(f"the standard library under {root} is too small for a corpus ({len(train)} bytes)")
    to_t = lambda b: torch.frombuffer(b, dtype=torch.uint8).clone()  # bytearray: writable, no warning
    return to_t(train), to_t(held)


def fingerprint(data: torch.Tensor) -> str:
    return f"{data.numel()}-{zlib.crc32(data.numpy().tobytes()):08x}"


def random_windows(data: torch.Tensor, batch: int, length: int, gen: torch.Generator):
    """batch windows of `length` bytes at random offsets -> int64 [batch, length]."""
    starts = torch.randint(0, data.numel() - length, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(length)[None, :]
    return data[idx].long()


def prompts(held: torch.Tensor, lengths, seed: int):
    """Prompts of the given lengths, cut from held-out code at line starts."""
    gen = torch.Generator().manual_seed(seed)
    nl = (held == ord("\n")).nonzero().flatten()
    out = []
    for n in lengths:
        for _ in range(100):  # a line start with n bytes after it
            s = int(nl[torch.randint(0, nl.numel(), (1,), generator=gen)]) + 1
            if s + n <= held.numel():
                break
        out.append(held[s:s + n].long().tolist())
    return out
