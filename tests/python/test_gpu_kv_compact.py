"""GPU: kdtree.kv_compact against a torch reference: per-layer lists and stacked caches, MLA and K+V,
random trees and accepted paths, uneven lengths, scattered pages. Every cache row is compared exactly."""

import math

import pytest
import torch

import kdtree
import torch_reference as R

pytestmark = pytest.mark.gpu


def make_case(*, layers, batch, width, page, row, mla, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    nodes = [int(torch.randint(1, width + 1, (1,), generator=gen)) for _ in range(batch)]
    prefixes = [int(torch.randint(0, 200, (1,), generator=gen)) for _ in range(batch)]
    kv_lens = [p + n for p, n in zip(prefixes, nodes)]
    need = [math.ceil(l / page) for l in kv_lens]
    max_pages = max(need) + 2
    num_pages = sum(need) + 3
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(batch, max_pages, dtype=torch.int32)
    at = 0
    for b in range(batch):
        table[b, :need[b]] = perm[at:at + need[b]]
        at += need[b]
    paths = torch.full((batch, width), -1, dtype=torch.int32)
    lens = []
    for b, n in enumerate(nodes):
        parents = R.random_parents(n, gen)
        node = int(torch.randint(0, n, (1,), generator=gen))  # accept the path root..node
        path = []
        while node >= 0:
            path.append(node)
            node = parents[node]
        path.reverse()
        paths[b, :len(path)] = torch.tensor(path, dtype=torch.int32)
        lens.append(len(path) - 1)

    def caches():
        return [torch.randn(num_pages, page, *row, generator=gen).to(dtype).cuda() for _ in range(layers)]

    i32 = dict(dtype=torch.int32, device="cuda")
    return dict(k=caches(), v=None if mla else caches(), page_table=table.cuda(), kv_lens=torch.tensor(kv_lens, **i32),
                node_counts=torch.tensor(nodes, **i32), accepted_path=paths.cuda(), accept_lens=torch.tensor(lens, **i32))


CASES = [  # (layers, batch, width, page, row, mla, dtype, stacked)
    (3, 4, 16, 16, (1, 576), True, torch.bfloat16, False),
    (5, 3, 64, 1, (576,), True, torch.bfloat16, True),
    (2, 5, 32, 64, (8, 128), False, torch.float16, False),
    (4, 2, 128, 16, (2, 64), False, torch.bfloat16, True),
    (1, 6, 64, 128, (4, 256), False, torch.float16, False),
    # e4m3 rows (bytes): MLA 576, GQA 64/128/256 per head.
    (3, 4, 16, 16, (1, 576), True, torch.float8_e4m3fn, False),
    (2, 3, 64, 64, (576,), True, torch.float8_e4m3fn, True),
    (2, 5, 32, 1, (1, 64), False, torch.float8_e4m3fn, False),
    (3, 2, 128, 16, (2, 128), False, torch.float8_e4m3fn, True),
    (1, 4, 64, 128, (4, 256), False, torch.float8_e4m3fn, False),
]


def _id(c):
    layers, batch, width, page, row, mla, dtype, stacked = c
    return (f"{'mla' if mla else 'k+v'},row={'x'.join(map(str, row))},L={layers},B={batch},W={width},page={page},"
            f"{ {torch.bfloat16: 'bf16', torch.float16: 'f16'}.get(dtype, 'e4m3') },"
            f"{'stacked' if stacked else 'list'}")


def _bits(t):
    """The bytes of a cache, compared exactly (float8 tensors have no != in every torch)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_kv_compact_matches_reference(case, record_error):
    layers, batch, width, page, row, mla, dtype, stacked = case
    c = make_case(layers=layers, batch=batch, width=width, page=page, row=row, mla=mla, dtype=dtype, seed=layers * 7 + width)
    ref_k = R.kv_compact_reference([_bits(t) for t in c["k"]], c["page_table"], c["kv_lens"], c["node_counts"],
                                   c["accepted_path"], c["accept_lens"])
    ref_v = None if mla else R.kv_compact_reference([_bits(t) for t in c["v"]], c["page_table"], c["kv_lens"], c["node_counts"],
                                                    c["accepted_path"], c["accept_lens"])
    k = torch.stack(c["k"]) if stacked else c["k"]
    v = None if mla else (torch.stack(c["v"]) if stacked else c["v"])
    assert kdtree.kv_compact(k, c["page_table"], c["kv_lens"], c["node_counts"], c["accepted_path"], c["accept_lens"],
                             v_caches=v) is None
    got_k = list(k.unbind(0)) if stacked else k
    mismatched = sum(int((_bits(a) != _bits(b)).sum()) for a, b in zip(got_k, ref_k))
    if not mla:
        got_v = list(v.unbind(0)) if stacked else v
        mismatched += sum(int((_bits(a) != _bits(b)).sum()) for a, b in zip(got_v, ref_v))
    record_error("kv_compact (mismatched elements)", _id(case), mismatched)
    assert mismatched == 0
    assert int(c["accept_lens"].max()) >= 0


def test_kv_compact_reuses_the_pointer_table_for_the_same_caches():
    from kdtree import _kv_compact as module
    c = make_case(layers=3, batch=2, width=16, page=16, row=(1, 576), mla=True, dtype=torch.bfloat16, seed=1)
    args = (c["page_table"], c["kv_lens"], c["node_counts"], c["accepted_path"], c["accept_lens"])
    kdtree.kv_compact(c["k"], *args)
    before = len(module._tables)
    kdtree.kv_compact(c["k"], *args)
    assert len(module._tables) == before
    kdtree.kv_compact([t.clone() for t in c["k"]], *args)
    assert len(module._tables) == before + 1
