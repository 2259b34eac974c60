"""The paged MLA KV cache and its page allocator.

One tensor [num_layers, num_pages, page_size, row_dim] holds every layer's cache (row = [c_kv |
k_rope], 576 values for the H200 model); kdtree's verify_attention reads layer l as
[num_pages, page_size, row_dim] and kv_compact takes the whole tensor. Pages are handed out per
request at admission for the request's whole life (prompt + generated tokens + one tree), so the
serving step never allocates and can be replayed as a CUDA graph.
"""
from __future__ import annotations

import torch


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


class PagedKVCache:
    def __init__(self, num_layers, num_pages, page_size, row_dim, dtype, device):
        self.page_size = page_size
        self.row_dim = row_dim
        self.k = torch.zeros(num_layers, num_pages, page_size, row_dim, dtype=dtype, device=device)
        self.allocator = PageAllocator(num_pages)

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
        self.k[layer].view(-1, self.row_dim).index_copy_(0, slots, rows.to(self.k.dtype))

    def gather(self, layer, page_table_row, length):
        """The first `length` rows of one request, [length, row_dim] (tests and diagnostics)."""
        ps = self.page_size
        pages = page_table_row[: (length + ps - 1) // ps].long()
        return self.k[layer][pages].reshape(-1, self.row_dim)[:length]
