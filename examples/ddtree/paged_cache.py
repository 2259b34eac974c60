"""The paged MLA KV cache and its page allocator.

One tensor [num_layers, num_pages, page_size, row_dim] holds every layer's cache (row = [c_kv |
k_rope], 576 values for the H200 model); kdtree's verify_attention reads layer l as
[num_pages, page_size, row_dim] and kv_compact takes the whole tensor. Pages are handed out per
request at admission for the request's whole life (prompt + generated tokens + one tree), so the
serving step never allocates and can be replayed as a CUDA graph.

With kv_dtype=torch.float8_e4m3fn the cache stores e4m3 codes, one scale for the whole cache: a row
value x is stored as x / kv_scale rounded to e4m3 (saturating at +-448) and read back as code x
kv_scale; verify_attention gets kv_scale as both k_scale and v_scale (MLA: V is the same row).
"""
from __future__ import annotations

import math

import torch

E4M3 = getattr(torch, "float8_e4m3fn", None)
E4M3_MAX = 448.0


class OutOfPages(ValueError):
    """The batch needs more pages than the cache has free."""


class PageAllocator:
    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low ids first

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc(self, n: int, what: str = "request") -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate {n} pages")
        if n > len(self._free):
            raise OutOfPages(f"{what} needs {n} pages but only {len(self._free)} of {self.num_pages} are free")
        return [self._free.pop() for _ in range(n)]

    def free(self, pages) -> None:
        for p in pages:
            if not 0 <= p < self.num_pages:
                raise ValueError(f"page {p} is not a page of this cache (0..{self.num_pages - 1})")
        if len(set(pages)) != len(pages) or set(pages) & set(self._free):
            raise ValueError("double free of a page")
        self._free.extend(reversed(list(pages)))


def scale_for(amax: float, headroom: float = 2.0) -> float:
    """A cache scale for values up to amax: the power of two that maps amax * headroom to at most 448
    (a power of two keeps x / scale exact, so only the e4m3 rounding touches the values; the headroom is
    for tokens past the calibration data)."""
    if not (math.isfinite(amax) and amax > 0):
        raise ValueError(f"kv scale: the calibration maximum must be finite and > 0, got {amax}")
    return 2.0 ** math.ceil(math.log2(amax * headroom / E4M3_MAX))


class PagedKVCache:
    def __init__(self, num_layers, num_pages, page_size, row_dim, dtype, device, *, kv_dtype=None, kv_scale=1.0):
        """dtype: the 16-bit type of the attention's q and out; kv_dtype: the cache's storage (None: dtype;
        or torch.float8_e4m3fn, with kv_scale > 0)."""
        self.page_size = page_size
        self.row_dim = row_dim
        store = dtype if kv_dtype is None else kv_dtype
        self.fp8 = E4M3 is not None and store == E4M3
        if not self.fp8 and store != dtype:
            raise ValueError(f"kv_dtype must be None, {dtype} or torch.float8_e4m3fn, got {kv_dtype}")
        if self.fp8 and not (math.isfinite(kv_scale) and kv_scale > 0):
            raise ValueError(f"kv_scale must be finite and > 0 for an e4m3 cache, got {kv_scale}")
        self.kv_scale = float(kv_scale) if self.fp8 else 1.0
        self.k = torch.zeros(num_layers, num_pages, page_size, row_dim, dtype=store, device=device)
        self.allocator = PageAllocator(num_pages)

    def attention_scales(self):
        """verify_attention's scale arguments for this cache ({} for a 16-bit one)."""
        return dict(k_scale=self.kv_scale, v_scale=self.kv_scale) if self.fp8 else {}

    @property
    def num_pages(self):
        return self.k.shape[1]

    def layer(self, i):
        return self.k[i]

    def slots(self, page_table, req, positions):
        """Flat row index (page * page_size + offset) of logical `positions` of requests `req`."""
        ps = self.page_size
        page = page_table[req, positions // ps].long()
        return page * ps + (positions % ps).long()

    def write(self, layer, slots, rows):
        if self.fp8:
            # Saturate first: torch's cast turns values past 448 into NaN. Copied as bytes (index_copy_
            # has no float8 kernel everywhere).
            codes = (rows.float() / self.kv_scale).clamp_(-E4M3_MAX, E4M3_MAX).to(E4M3)
            self.k[layer].view(-1, self.row_dim).view(torch.uint8).index_copy_(0, slots, codes.view(torch.uint8))
            return
        self.k[layer].view(-1, self.row_dim).index_copy_(0, slots, rows.to(self.k.dtype))
