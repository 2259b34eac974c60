"""Argument builders with consistent shapes (contents are placeholders), for the CPU validation and
fake-implementation tests. `device` may be "cpu" or "meta"."""

import torch


def verify_args(device="cpu", *, mla=True, batch=2, nodes=(3, 5), heads=16, kv_heads=1, head_dim=576, page=16,
                pages_per_req=4, num_pages=10, width=16, dtype=torch.bfloat16):
    n = sum(nodes)
    if mla:
        k = torch.zeros(num_pages, page, 1, 576, dtype=dtype, device=device)
        v = None
        head_dim = 576
    else:
        k = torch.zeros(num_pages, page, kv_heads, head_dim, dtype=dtype, device=device)
        v = torch.zeros_like(k)
    return dict(
        q=torch.zeros(n, heads, head_dim, dtype=dtype, device=device),
        k_cache=k,
        v_cache=v,
        page_table=torch.zeros(batch, pages_per_req, dtype=torch.int32, device=device),
        kv_lens=torch.zeros(batch, dtype=torch.int32, device=device),
        node_indptr=torch.zeros(batch + 1, dtype=torch.int32, device=device),
        tree_mask=torch.zeros(n, (width + 63) // 64, dtype=torch.int64, device=device),
        max_tree_nodes=width,
    )


def tree_build_args(device="cpu", *, batch=3, depth=4, top_k=5, budget=10, width=16):
    return dict(
        draft_tokens=torch.zeros(batch, depth, top_k, dtype=torch.int32, device=device),
        draft_logprobs=torch.zeros(batch, depth, top_k, dtype=torch.float32, device=device),
        root_tokens=torch.zeros(batch, dtype=torch.int32, device=device),
        prefix_lens=torch.zeros(batch, dtype=torch.int32, device=device),
        budget=budget,
        max_tree_nodes=width,
    )


def tree_accept_args(device="cpu", *, batch=3, width=32, packed=False, total=20):
    i32 = dict(dtype=torch.int32, device=device)
    return dict(
        tokens=torch.zeros(batch, width, **i32),
        parents=torch.zeros(batch, width, **i32),
        node_counts=torch.zeros(batch, **i32),
        target_tokens=torch.zeros(total, **i32) if packed else torch.zeros(batch, width, **i32),
        node_indptr=torch.zeros(batch + 1, **i32) if packed else None,
    )


def sample_args(device="cpu", *, rows=6, vocab=100, dtype=torch.float32):
    return dict(logits=torch.zeros(rows, vocab, dtype=dtype, device=device), temperature=0.0, seed=0,
                row_offsets=None)


def kv_compact_args(device="cpu", *, layers=3, batch=2, width=16, page=16, num_pages=8, pages_per_req=4,
                    row=(1, 576), mla=True, stacked=False, dtype=torch.bfloat16):
    def caches():
        if stacked:
            return torch.zeros(layers, num_pages, page, *row, dtype=dtype, device=device)
        return [torch.zeros(num_pages, page, *row, dtype=dtype, device=device) for _ in range(layers)]
    i32 = dict(dtype=torch.int32, device=device)
    return dict(
        k_caches=caches(),
        v_caches=None if mla else caches(),
        page_table=torch.zeros(batch, pages_per_req, **i32),
        kv_lens=torch.zeros(batch, **i32),
        node_counts=torch.zeros(batch, **i32),
        accepted_path=torch.zeros(batch, width, **i32),
        accept_lens=torch.zeros(batch, **i32),
    )
