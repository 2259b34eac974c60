"""GPU: the operators as torch sees them: torch.library.opcheck on each, CUDA-graph capture and replay
equal to eager, torch.compile(fullgraph=True), two streams, several devices."""

import pytest
import torch

import kdtree
import torch_reference as R
from test_gpu_kv_compact import make_case as kv_case
from test_gpu_tree_ops import random_draft

pytestmark = pytest.mark.gpu


def _verify_case(seed=11, mla=True):
    if mla:
        return R.verify_case(mla=True, heads=16, kv_heads=1, head_dim=576, page=64, width=64, dtype=torch.bfloat16,
                             batch=3, seed=seed, device="cuda")
    return R.verify_case(mla=False, heads=16, kv_heads=4, head_dim=128, page=16, width=32, dtype=torch.float16,
                         batch=3, seed=seed, device="cuda")


def _verify_op_args(c, lse=True):
    return (c["q"], c["k_cache"], c["v_cache"], c["page_table"], c["kv_lens"], c["node_indptr"], c["tree_mask"],
            c["max_tree_nodes"], None, None, lse)


@pytest.mark.parametrize("mla", [True, False], ids=["mla576/512", "gqa128"])
def test_opcheck_verify_attention(mla):
    torch.library.opcheck(torch.ops.kdtree.verify_attention.default, _verify_op_args(_verify_case(mla=mla)))


def test_opcheck_tree_build():
    draft = random_draft(3, 6, 8, 1000, seed=5)
    torch.library.opcheck(torch.ops.kdtree.tree_build.default, (*draft, 31, 32))


def test_opcheck_tree_accept():
    draft = random_draft(3, 6, 8, 10, seed=6)
    t = kdtree.tree_build(*draft, budget=31, max_tree_nodes=32)
    targets = torch.randint(0, 10, (3, 32), dtype=torch.int32, device="cuda")
    torch.library.opcheck(torch.ops.kdtree.tree_accept.default, (t.tokens, t.parents, t.node_counts, targets, None))


def test_opcheck_sample_tokens():
    logits = torch.randn(9, 3000, device="cuda")
    torch.library.opcheck(torch.ops.kdtree.sample_tokens.default, (logits, 0.8, 17, None))
    torch.library.opcheck(torch.ops.kdtree.sample_tokens.default, (logits.bfloat16(), 0.0, 0, None))


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
def test_opcheck_kv_compact(stacked):
    c = kv_case(layers=2, batch=3, width=16, page=16, row=(2, 64), mla=False, dtype=torch.bfloat16, seed=8)
    k = [torch.stack(c["k"])] if stacked else c["k"]
    v = [torch.stack(c["v"])] if stacked else c["v"]
    torch.library.opcheck(torch.ops.kdtree.kv_compact.default,
                          (k, v, c["page_table"], c["kv_lens"], c["node_counts"], c["accepted_path"],
                           c["accept_lens"], stacked))


def _step(c, draft, logits, kv):
    """One speculative step's worth of kdtree calls (every operator)."""
    out, lse = kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                       c["tree_mask"], max_tree_nodes=c["max_tree_nodes"], v_cache=c["v_cache"],
                                       return_lse=True)
    tree = kdtree.tree_build(*draft, budget=15, max_tree_nodes=16)
    targets = kdtree.sample_tokens(logits, temperature=0.9, seed=5).view(tree.tokens.shape)
    path, lens, bonus = kdtree.tree_accept(tree.tokens, tree.parents, tree.node_counts, targets)
    kdtree.kv_compact(kv["k"], kv["page_table"], kv["kv_lens"], kv["node_counts"], kv["accepted_path"],
                      kv["accept_lens"], v_caches=kv["v"])
    return [out, lse, *tree, targets, path, lens, bonus]


def test_cuda_graph_replay_equals_eager():
    c = _verify_case(seed=21, mla=False)
    draft = random_draft(4, 5, 6, 50, seed=22)
    logits = torch.randn(4 * 16, 50, device="cuda")
    kv = kv_case(layers=3, batch=2, width=16, page=16, row=(2, 64), mla=False, dtype=torch.float16, seed=23)
    k0, v0 = [t.clone() for t in kv["k"]], [t.clone() for t in kv["v"]]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiles, fills the kv_compact pointer tables
        eager = [t.clone() for t in _step(c, draft, logits, kv)]
    torch.cuda.current_stream().wait_stream(side)
    eager_k = [t.clone() for t in kv["k"]]
    eager_v = [t.clone() for t in kv["v"]]

    graph = torch.cuda.CUDAGraph()
    for t, t0 in zip(kv["k"] + kv["v"], k0 + v0):
        t.copy_(t0)
    with torch.cuda.graph(graph):
        captured = _step(c, draft, logits, kv)
    # Capture records without running: reset the caches, then replay twice (from the same start).
    for _ in range(2):
        for t, t0 in zip(kv["k"] + kv["v"], k0 + v0):
            t.copy_(t0)
        for t in captured:
            t.zero_()
        graph.replay()
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(captured, eager)):
            assert torch.equal(a, b), f"output {i} differs from eager"
        for a, b in zip(kv["k"] + kv["v"], eager_k + eager_v):
            assert torch.equal(a, b)
    # New inputs copied into the captured buffers flow through the replay.
    c["q"].copy_(torch.randn_like(c["q"].float()).to(c["q"].dtype))
    graph.replay()
    torch.cuda.synchronize()
    fresh = kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                    c["tree_mask"], max_tree_nodes=c["max_tree_nodes"], v_cache=c["v_cache"])
    assert torch.equal(captured[0], fresh)


def test_cuda_graph_capture_with_unseen_list_caches_is_a_clear_error():
    kv = kv_case(layers=2, batch=2, width=16, page=16, row=(1, 576), mla=True, dtype=torch.bfloat16, seed=31)
    caches = [t.clone() for t in kv["k"]]  # new addresses: no pointer table yet
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"^k_caches: the per-layer pointer table"):
        with torch.cuda.graph(graph):
            kdtree.kv_compact(caches, kv["page_table"], kv["kv_lens"], kv["node_counts"], kv["accepted_path"],
                              kv["accept_lens"])
    # The stacked form builds its table on the device, also inside capture.
    stacked = torch.stack(kv["k"])
    expect = stacked.clone()
    kdtree.kv_compact(expect, kv["page_table"], kv["kv_lens"], kv["node_counts"], kv["accepted_path"], kv["accept_lens"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kdtree.kv_compact(stacked, kv["page_table"], kv["kv_lens"], kv["node_counts"], kv["accepted_path"],
                          kv["accept_lens"])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(stacked, expect)


def test_torch_compile_fullgraph_verify_attention():
    c = _verify_case(seed=41)

    @torch.compile(fullgraph=True)
    def attend(q, k, pt, lens, indptr, mask):
        out, lse = kdtree.verify_attention(q * 2, k, pt, lens, indptr, mask, max_tree_nodes=64, return_lse=True)
        return out.float() * 0.5, lse + 1.0

    q2 = c["q"] * 2
    ref_out, ref_lse = kdtree.verify_attention(q2, c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                               c["tree_mask"], max_tree_nodes=64, return_lse=True)
    out, lse = attend(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"], c["tree_mask"])
    assert torch.equal(out, ref_out.float() * 0.5)
    assert torch.equal(lse, ref_lse + 1.0)


def test_torch_compile_fullgraph_whole_step():
    draft = random_draft(2, 4, 4, 20, seed=42)
    logits = torch.randn(2 * 16, 20, device="cuda")

    def step(draft_tokens, draft_logprobs, roots, prefixes, logits):
        tree = kdtree.tree_build(draft_tokens, draft_logprobs, roots, prefixes, budget=12, max_tree_nodes=16)
        targets = kdtree.sample_tokens(logits).view(2, 16)
        return kdtree.tree_accept(tree.tokens, tree.parents, tree.node_counts, targets)

    compiled = torch.compile(step, fullgraph=True)
    for a, b in zip(compiled(*draft, logits), step(*draft, logits)):
        assert torch.equal(a, b)


def test_two_streams_run_concurrently_and_match():
    cases = [_verify_case(seed=51), _verify_case(seed=52, mla=False)]
    expect = [kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                      c["tree_mask"], max_tree_nodes=c["max_tree_nodes"], v_cache=c["v_cache"])
              for c in cases]
    torch.cuda.synchronize()
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    results = [[], []]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for i, (s, c) in enumerate(zip(streams, cases)):
            with torch.cuda.stream(s):
                results[i].append(kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"],
                                                          c["node_indptr"], c["tree_mask"],
                                                          max_tree_nodes=c["max_tree_nodes"], v_cache=c["v_cache"]))
    torch.cuda.synchronize()
    for i in range(2):
        for r in results[i]:
            assert torch.equal(r, expect[i])
    # Each stream that needs a workspace got one of its own.
    from kdtree import _launch
    needing = sum(kdtree.verify_workspace_size(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                               c["tree_mask"], max_tree_nodes=c["max_tree_nodes"],
                                               v_cache=c["v_cache"]) > 0 for c in cases)
    keys = {k for k in _launch._workspaces if k[1] in {s.cuda_stream for s in streams}}
    assert len(keys) == needing


def test_every_visible_device_has_its_own_runtime():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip(f"only {n} GPU visible: the multi-device test needs 2")
    outs = []
    for d in range(2):
        logits = torch.randn(8, 100, device=f"cuda:{d}")
        outs.append((kdtree.sample_tokens(logits), logits))
    for tokens, logits in outs:
        assert tokens.device == logits.device
        assert torch.equal(tokens.long(), logits.argmax(-1))
    from kdtree import _runtime
    assert {0, 1} <= set(_runtime._runtimes)
