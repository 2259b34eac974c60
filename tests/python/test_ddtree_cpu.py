"""CPU tests of the DDTree example (examples/ddtree): the plain-torch op backend against
independent brute-force checks, the MLA absorbed decode path against the training forward, the
serving loop's losslessness (greedy equality, sampling TV) with a tiny trained model, negative
controls that show those checks fail on a broken loop, and bad-input errors."""
import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.ddtree import bench, checks, engine, run, torch_ops, train  # noqa: E402
from examples.ddtree.paged_cache import OutOfPages, PageAllocator  # noqa: E402

CPU = dict(device="cpu", dtype=torch.float32, page_size=16)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Many small ops: more threads only add contention on a 2-core CI machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import os
    old = os.environ.get("KDTREE_DDTREE_CACHE")
    os.environ["KDTREE_DDTREE_CACHE"] = str(tmp_path_factory.mktemp("ddtree-cache"))
    try:
        target, drafter, cfg, _ = train.get_models("tiny", "cpu", log=lambda *a: None)
    finally:
        if old is None:
            del os.environ["KDTREE_DDTREE_CACHE"]
        else:
            os.environ["KDTREE_DDTREE_CACHE"] = old
    return target, drafter, cfg


@pytest.fixture(scope="module")
def prompts():
    return train.corpus_prompts("tiny", [20, 33, 50, 7, 41, 12], seed=3)


# ----------------------------------------------------------------------------- the torch ops

def _draft(B, D, K, seed):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(B, D, 50, generator=g) * 2, -1)
    vals, idx = lp.topk(K, dim=-1)
    return idx.to(torch.int32), vals


@pytest.mark.parametrize("B,D,K,budget,W", [(3, 3, 3, 15, 16), (2, 4, 2, 20, 32), (1, 2, 4, 19, 32)])
def test_tree_build_selects_the_top_budget_paths(B, D, K, budget, W):
    """tree_build[W] against enumeration of every path: the selected nodes are the budget best by
    (score desc, depth asc, rank path asc), in that order, with consistent links and masks."""
    tokens, lps = _draft(B, D, K, seed=B * 100 + D)
    roots = torch.tensor([7, 8, 9][:B], dtype=torch.int32)
    prefix = torch.tensor([5, 0, 130][:B], dtype=torch.int32)
    t = torch_ops.tree_build(tokens, lps, roots, prefix, budget=budget, max_tree_nodes=W)
    for b in range(B):
        paths = [p for d in range(1, D + 1) for p in itertools.product(range(K), repeat=d)]
        score = {p: float(sum(torch.tensor([lps[b, i, r] for i, r in enumerate(p)], dtype=torch.float32).tolist()))
                 for p in paths}
        best = sorted(paths, key=lambda p: (-score[p], len(p), p))[:budget]
        n = int(t.node_counts[b])
        assert n == budget + 1
        # reconstruct each node's rank path from parents and tokens
        got = [()]
        for i in range(1, n):
            par = int(t.parents[b, i])
            assert 0 <= par < i
            d = len(got[par]) + 1
            rank = tokens[b, d - 1].tolist().index(int(t.tokens[b, i]))
            got.append(got[par] + (rank,))
            assert int(t.depths[b, i]) == d and int(t.positions[b, i]) == int(prefix[b]) + d
            assert math.isclose(float(t.scores[b, i]), score[got[i]], rel_tol=1e-5, abs_tol=1e-5)
        assert got[1:] == best
        assert int(t.tokens[b, 0]) == int(roots[b]) and int(t.parents[b, 0]) == -1
        for i in range(n):
            anc, j = {i}, i
            while j > 0:
                j = int(t.parents[b, j])
                anc.add(j)
            bits = {j for j in range(W) if (int(t.tree_mask[b, i, j // 64]) >> (j % 64)) & 1}
            assert bits == anc
            kids = [j for j in range(n) if int(t.parents[b, j]) == i and j > 0]
            assert int(t.first_child[b, i]) == (kids[0] if kids else -1)
            if i > 0:
                sibs = [j for j in range(i + 1, n) if int(t.parents[b, j]) == int(t.parents[b, i])]
                assert int(t.next_sibling[b, i]) == (sibs[0] if sibs else -1)
        assert (t.tokens[b, n:] == -1).all() and (t.tree_mask[b, n:] == 0).all()


def test_tree_build_rejects_budget_over_width():
    tokens, lps = _draft(1, 2, 2, 0)
    with pytest.raises(ValueError, match="budget"):
        torch_ops.tree_build(tokens, lps, torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                             budget=128, max_tree_nodes=128)


def test_tree_accept_follows_target_tokens():
    # tree: 0 -> 1 (tok 5), 0 -> 2 (tok 6), 1 -> 3 (tok 7), 2 -> 4 (tok 8), 3 -> 5 (tok 9)
    tokens = torch.tensor([[4, 5, 6, 7, 8, 9]], dtype=torch.int32)
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3]], dtype=torch.int32)
    counts = torch.tensor([6], dtype=torch.int32)
    cases = [([6, 0, 8, 0, 1, 0], [0, 2, 4], 1),      # root->6 (node 2)->8 (node 4)->target 1 (bonus)
             ([5, 7, 0, 9, 0, 3], [0, 1, 3, 5], 3),   # the full chain; bonus = target at node 5
             ([1, 5, 6, 7, 8, 9], [0], 1)]            # nothing accepted
    for targets, path, bonus in cases:
        p, acc, bon = torch_ops.tree_accept(tokens, parents, counts, torch.tensor([targets], dtype=torch.int32))
        assert p[0, :len(path)].tolist() == path and (p[0, len(path):] == -1).all()
        assert int(acc[0]) == len(path) - 1 and int(bon[0]) == bonus
        # packed layout with node_indptr gives the same
        p2, acc2, bon2 = torch_ops.tree_accept(tokens, parents, counts, torch.tensor(targets, dtype=torch.int32),
                                               node_indptr=torch.tensor([0, 6], dtype=torch.int32))
        assert torch.equal(p, p2) and torch.equal(acc, acc2) and torch.equal(bon, bon2)


def test_kv_compact_moves_rows_through_pages_read_before_write():
    page, P, L = 4, 6, 2
    cache = torch.arange(L * P * page * 3, dtype=torch.float32).view(L, P, page, 3)
    before = cache.clone()
    table = torch.tensor([[5, 2, 0], [1, 3, 4]], dtype=torch.int32)
    # request 0: prefix 3, 6 nodes, path 0,2,3,5 (entry j moves from 3+n_j to 3+j: 5->4, 6->5, 8->6;
    # position 5 is the destination of entry 2 and the source of entry 1: read before write)
    # request 1: prefix 1, 3 nodes, path 0 only (no move)
    kv = torch.tensor([9, 4], dtype=torch.int32)
    counts = torch.tensor([6, 3], dtype=torch.int32)
    path = torch.tensor([[0, 2, 3, 5, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1, -1, -1]], dtype=torch.int32)
    acc = torch.tensor([3, 0], dtype=torch.int32)
    torch_ops.kv_compact(cache, table, kv, counts, path, acc)

    def row(c, b, pos):
        return c[:, int(table[b, pos // page]), pos % page]

    for j, n in enumerate([0, 2, 3, 5]):
        assert torch.equal(row(cache, 0, 3 + j), row(before, 0, 3 + n))
    for pos in range(3):
        assert torch.equal(row(cache, 0, pos), row(before, 0, pos))
    assert torch.equal(cache[:, [1, 3, 4]], before[:, [1, 3, 4]])


def test_sample_tokens_greedy_ties_and_seeded_sampling():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, float("nan"), 0.0]])
    assert torch_ops.sample_tokens(logits).tolist() == [1, 0]
    # Sampling: frequencies follow softmax within a bound computed from the sample size.
    V, n = 6, 20000
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    toks = torch_ops.sample_tokens(base.repeat(n, 1), temperature=1.0, seed=3, row_offsets=torch.arange(n))
    freq = torch.bincount(toks.long(), minlength=V).double() / n
    p = torch.softmax(base.double(), 0)
    sd = (p * (1 - p) / n).sqrt()
    assert ((freq - p).abs() <= 5 * sd + 1e-12).all(), (freq, p)
    # Same seed and offsets -> same tokens; other offsets -> other draws.
    again = torch_ops.sample_tokens(base.repeat(n, 1), temperature=1.0, seed=3, row_offsets=torch.arange(n))
    other = torch_ops.sample_tokens(base.repeat(n, 1), temperature=1.0, seed=3, row_offsets=torch.arange(n) + n)
    assert torch.equal(toks, again) and not torch.equal(toks, other)
    # temperature 0.5 sharpens: softmax(2 * logits)
    t2 = torch_ops.sample_tokens(base.repeat(n, 1), temperature=0.5, seed=4)
    f2 = torch.bincount(t2.long(), minlength=V).double() / n
    p2 = torch.softmax(2 * base.double(), 0)
    assert ((f2 - p2).abs() <= 5 * (p2 * (1 - p2) / n).sqrt() + 1e-12).all()


def test_verify_attention_chain_tree_equals_causal_attention():
    """A chain tree is causal attention: compare with dense softmax over a contiguous copy."""
    g = torch.Generator().manual_seed(0)
    page, H, Dqk, Dv = 4, 3, 24, 16
    lens, nodes = [11, 6], [5, 3]
    P = 8
    cache = torch.randn(P, page, Dqk, generator=g)
    table = torch.tensor([[6, 1, 3, -1], [0, 7, -1, -1]], dtype=torch.int32)
    q = torch.randn(sum(nodes), H, Dqk, generator=g)
    mask = torch.tensor([[(1 << (i + 1)) - 1] for n in nodes for i in range(n)], dtype=torch.int64)
    indptr = torch.tensor([0, 5, 8], dtype=torch.int32)
    out, lse = torch_ops.verify_attention(q, cache, table, torch.tensor(lens, dtype=torch.int32), indptr, mask,
                                          max_tree_nodes=16, v_cache=cache[..., :Dv], sm_scale=0.3, return_lse=True)
    r = 0
    for b, (L, n) in enumerate(zip(lens, nodes)):
        seq = torch.cat([cache[int(p)] for p in table[b] if p >= 0])[:L]
        for i in range(n):
            s = (q[r] @ seq[: L - n + i + 1].T) * 0.3
            ref = torch.softmax(s, -1) @ seq[: L - n + i + 1, :Dv]
            assert torch.allclose(out[r], ref, atol=1e-5)
            assert torch.allclose(lse[r], torch.logsumexp(s, -1), atol=1e-5)
            r += 1


def test_page_allocator():
    a = PageAllocator(5)
    x = a.alloc(3)
    assert len(set(x)) == 3 and a.free_pages == 2
    with pytest.raises(OutOfPages, match="needs 3 pages but only 2 of 5 are free"):
        a.alloc(3)
    a.free(x)
    assert a.free_pages == 5
    with pytest.raises(ValueError, match="double free"):
        a.free([x[0], x[0]])
    with pytest.raises(ValueError, match="not a page"):
        a.free([7])


# ----------------------------------------------------------------------------- the model

@torch.no_grad()
def test_absorbed_paged_decode_equals_training_forward(models, prompts):
    """Token-by-token decode (absorbed MLA, paged cache, verify_attention) reproduces the logits of
    the unabsorbed full-sequence forward."""
    target, drafter, cfg = models
    seq = torch.tensor(prompts[2][:24])
    full, _, _ = target(seq[None])
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="ar", batch_size=1, max_prompt=32, max_new=24, **CPU)
    e.admit([seq[:2].tolist()])
    for i in range(1, 23):  # root = seq[i] at position i
        e.root.fill_(int(seq[i]))
        stages = dict(e.stages())
        stages["target"]()
        assert torch.allclose(e.s["logits"][0], full[0, i], atol=2e-4, rtol=1e-4), i
        e.kv_lens.add_(1)


# ----------------------------------------------------------------------------- the serving loop

def test_greedy_speculative_equals_autoregressive(models, prompts):
    g = checks.greedy_equality(models, torch_ops, prompts, max_new=48, budget=15, top_k=4, **CPU)
    assert g["other_divergences"] == 0, g["requests"]
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["mean_tokens_per_step"] > 1.2  # the drafter is predictive: trees accept tokens


E4M3 = getattr(torch, "float8_e4m3fn", None)
needs_e4m3 = pytest.mark.skipif(E4M3 is None, reason=f"torch {torch.__version__} has no float8_e4m3fn")


@needs_e4m3
def test_greedy_speculative_equals_autoregressive_over_an_e4m3_cache(models, prompts):
    # --kv-dtype e4m3: both loops decode over the same fp8 cache (one calibrated scale).
    target = models[0]
    scale = run.calibrate_kv_scale(target, prompts, "cpu")
    assert scale > 0 and math.log2(scale) == int(math.log2(scale))  # a power of two
    g = checks.greedy_equality(models, torch_ops, prompts, max_new=48, budget=15, top_k=4, kv_dtype=E4M3,
                               kv_scale=scale, **CPU)
    assert g["other_divergences"] == 0, g["requests"]
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["mean_tokens_per_step"] > 1.2


@needs_e4m3
def test_e4m3_paged_cache_stores_codes_and_saturates():
    from examples.ddtree.paged_cache import PagedKVCache, scale_for
    assert scale_for(100.0) == 0.5  # 200 / 0.5 = 400 <= 448; 0.25 would give 800
    with pytest.raises(ValueError, match="calibration maximum"):
        scale_for(0.0)
    c = PagedKVCache(2, 3, 4, 16, torch.float32, "cpu", kv_dtype=E4M3, kv_scale=0.5)
    assert c.k.dtype == E4M3 and c.attention_scales() == dict(k_scale=0.5, v_scale=0.5)
    rows = torch.tensor([[1.0] * 15 + [1e6], [-3.0] * 16])
    c.write(1, torch.tensor([0, 5]), rows)
    flat = c.k[1].view(-1, 16).float() * 0.5
    assert flat[0, 0] == 1.0 and flat[0, 15] == 224.0  # saturated to 448 x 0.5, not NaN
    assert (flat[5] == -3.0).all() and (flat[1:5] == 0).all()
    with pytest.raises(ValueError, match="kv_scale must be finite and > 0"):
        PagedKVCache(1, 1, 4, 16, torch.float32, "cpu", kv_dtype=E4M3, kv_scale=0.0)
    assert PagedKVCache(1, 1, 4, 16, torch.float32, "cpu").attention_scales() == {}


def test_greedy_check_fails_without_kv_compact(models, prompts):
    """Negative control: a loop that skips kv_compact keeps rejected nodes' KV and diverges."""
    class NoCompact:
        def __getattr__(self, name):
            return getattr(torch_ops, name)

        @staticmethod
        def kv_compact(*a, **k):
            return None

    g = checks.greedy_equality(models, NoCompact(), prompts, max_new=48, budget=15, top_k=4, **CPU)
    assert g["other_divergences"] > 0


def test_sampling_distribution_matches_autoregressive(models, prompts):
    r = checks.sampling_tv(models, torch_ops, prompts[1], n_samples=600, budget=15, top_k=4, chunk=600,
                           rounds=400, **CPU)
    for name, st in r["stats"].items():
        assert st["tv"] <= st["threshold"], (name, st)
    assert r["coupled_identical_fraction"] == 1.0


def test_sampling_tv_detects_lossy_acceptance(models, prompts):
    """Negative control: accepting the drafter's best child whatever the target sampled is lossy;
    the TV test must reject it."""
    class AcceptDraft:
        def __getattr__(self, name):
            return getattr(torch_ops, name)

        @staticmethod
        def tree_accept(tokens, parents, node_counts, target_tokens, *, node_indptr=None):
            path, acc, bonus = torch_ops.tree_accept(tokens, parents, node_counts, target_tokens,
                                                     node_indptr=node_indptr)
            # always take child 1 of the root (the drafter's top token) when the target did not
            take = (acc == 0) & (parents[:, 1] == 0)
            path[take, 1] = 1
            acc = torch.where(take, torch.ones_like(acc), acc)
            t = target_tokens.view(tokens.shape[0], -1)[:, 1]
            bonus = torch.where(take, t, bonus)
            return path, acc, bonus

    r = checks.sampling_tv(models, AcceptDraft(), prompts[1], n_samples=600, budget=15, top_k=4, chunk=600,
                           rounds=400, **CPU)
    assert any(st["tv"] > st["threshold"] for st in r["stats"].values()), r["stats"]


# ----------------------------------------------------------------------------- the benchmark's figures

def test_throughput_batch1_aggregates_prompts_one_at_a_time(models, prompts):
    """throughput[batch=1, 3 prompts, budget=8, W=16]: tokens/s is all tokens over the summed time
    and each prompt's tokens/step is its own (equal to decoding that prompt alone on the same
    engine shape), so the batch-1 figure is not one prompt's (which a repetition loop inflates)."""
    groups = [[p] for p in prompts[:3]]
    kw = dict(max_new=24, budget=8, top_k=4, device="cpu", dtype=torch.float32)
    r = bench.throughput(models, torch_ops, groups, mode="spec", graphs=False, repeats=1, **kw)
    assert (r["batch"], r["groups"]) == (1, 3)
    assert r["tokens_per_s"] == pytest.approx(3 * 24 / r["seconds"])
    assert r["batch_tokens_per_step"] == pytest.approx(3 * 24 / r["steps"])
    target, drafter, cfg = models
    steps, accepted, per_prompt = 0, [], []
    for (p,) in groups:
        e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=1,
                          max_prompt=max(len(q) for q in prompts[:3]), **kw)
        res = e.generate([p])
        acc = [row[0] for row in res.accept_lens if row[0] >= 0]
        steps += res.steps
        accepted += acc
        per_prompt.append(sum(a + 1 for a in acc) / len(acc))
    assert r["steps"] == steps
    assert r["request_tokens_per_step"] == pytest.approx(per_prompt)
    assert r["tokens_per_step"] == pytest.approx(sum(a + 1 for a in accepted) / len(accepted))
    with pytest.raises(ValueError, match="every group must have 1 prompts"):
        bench.throughput(models, torch_ops, [[prompts[0]], prompts[1:3]], mode="ar", graphs=False, **kw)


def test_summary_line_names_the_step_cost_that_grows():
    """summary[batch=64, budget=16]: the speedup as its two factors, then the DDTree step's extra time
    split into the target forward over B x (budget + 1) rows, the drafter and the tree ops."""
    row = {"batch": 64, "best_budget": 16, "ar": {"tokens_per_s": 74071.0, "step_ms": 0.864},
           "spec": [{"budget": 16, "tokens_per_s": 56842.0, "speedup": 0.767, "batch_tokens_per_step": 2.9,
                     "step_time_ratio": 0.396, "step_ms": 2.184}]}
    ops = {"batch 64 ar": {"target": 0.837, "sample_tokens": 0.012, "update": 0.021,
                           "verify_attention (all layers)": 0.226},
           "batch 64 spec budget 16": {"drafter": 0.179, "tree_build": 0.009, "target": 1.741,
                                       "sample_tokens": 0.023, "tree_accept": 0.005, "kv_compact": 0.007,
                                       "update": 0.070, "verify_attention (all layers)": 0.545}}
    line = run.summary_line(row, ops)
    assert "0.77x = 2.90 tok/step x 0.396 (AR 0.864 / DDTree 2.184 ms per step)" in line
    assert "the DDTree step adds 1.164 ms: target forward +0.904 ms (0.837 -> 1.741 ms, 2.08x, for 17x the rows: " \
           "1088 vs 64; of it verify_attention +0.319), drafter 0.179, tree_build+tree_accept+kv_compact 0.021, " \
           "sampling+update +0.060" in line
    assert "adds" not in run.summary_line(row, {})  # without the per-op times: the two factors only


def test_simulation_over_a_forced_trace_replays_the_real_loop(models, prompts):
    """examples/ddtree/trace.py + simulate.py: a fixed-budget decode's accepted count at every step, its step
    count and its text are what the walk through the teacher-forced trace's counterfactual table predicts (the
    premise of judging budget policies offline); the walk with another budget's column does not."""
    from examples.ddtree import simulate, trace
    ps = prompts[:4]
    max_new = 24
    tr = trace.forced_trace(models, torch_ops, ps, max_new=max_new, top_k=4, device="cpu", dtype=torch.float32)
    assert tr["paths"].shape == (max_new, 4, models[2].draft_depth) and tr["tokens"].shape == (4, max_new)
    budgets = (2, 5, 15)
    counts = simulate.count_table(tr["paths"], budgets)
    walks = {}
    for k, b in enumerate(budgets):
        e = engine.Engine(*models, torch_ops, mode="spec", batch_size=4, max_prompt=max(map(len, ps)),
                          max_new=max_new, budget=b, top_k=4, device="cpu", dtype=torch.float32)
        r = e.generate(ps)
        assert np.array_equal(np.asarray(r.tokens), tr["tokens"]), b  # the text does not depend on the budget
        g = np.zeros(4, dtype=np.int64)
        walk = []
        for _ in range(r.steps):
            c = np.where(g < max_new, counts[np.minimum(g, max_new - 1), np.arange(4), k], -1)
            walk.append(c.tolist())
            g = np.where(c >= 0, g + 1 + c, g)
        assert walk == r.accept_lens, b
        secs, rounds = simulate.run_group(counts, budgets, {x: 1.0 for x in budgets}, simulate.Fixed(b),
                                          max_new=max_new, lag=0)  # a CPU engine reads every step at once
        assert rounds == r.steps and secs == r.steps, b
        walks[b] = walk
    assert walks[2] != walks[15]  # the columns differ: the comparison above can fail


def test_simulate_reads_a_saved_trace(models, prompts, tmp_path, capsys):
    """trace.save -> simulate.main: fixed budgets and auto's replay per batch size, from the file alone."""
    from examples.ddtree import simulate, trace
    tr = trace.forced_trace(models, torch_ops, prompts[:2], max_new=16, top_k=4, device="cpu", dtype=torch.float32)
    costs = {str(b): 1e-3 * (1 + b / 16) for b in (1, 2, 4, 8, 15)}
    trace.save(tmp_path / "t.npz", {"batches": [1, 2], "max_new": 16, "weights": "float32", "text_check": {},
                                    "costs": {"1": costs, "2": costs}}, [tr, tr])
    with pytest.raises(ValueError, match="2 traces for batches"):
        trace.save(tmp_path / "u.npz", {"batches": [1]}, [tr, tr])
    simulate.main([str(tmp_path / "t.npz"), "--budgets", "1,4,15"])
    out = capsys.readouterr().out
    assert "batch   1: fixed 1:" in out and "batch   2: fixed 1:" in out and "auto" in out, out
    simulate.main([str(tmp_path / "t.npz"), "--budgets", "1,4,15", "--resample", "2"])
    out = capsys.readouterr().out
    assert "batch   2, 2 random prompt groups" in out, out
    assert "over all the groups, auto / the best fixed budget" in out, out
    simulate.main([str(tmp_path / "t.npz"), "--budgets", "1,4,15", "--serve", "2", "--alloc"])
    out = capsys.readouterr().out
    assert "batch   2, 2 prompt groups in turn through one policy: auto" in out, out
    assert "batch   2, 2 prompt groups in turn through one policy (allocated over the batch): auto" in out, out
    # serve's bookkeeping: an auto with one candidate runs that budget's rounds, so it decodes the same groups in
    # the same time as the fixed budget (the calibration's group left out of both)
    meta, groups = simulate.load(tmp_path / "t.npz")
    for alloc in (False, True):
        ra, rates, hist = simulate.serve(meta, groups, (4,), n=3, seed=1, alloc=alloc)[2]
        assert ra == pytest.approx(rates[4], rel=1e-12) and set(hist) == {4}, (alloc, ra, rates, hist)
        assert rates[15] != rates[1]  # the budgets' rates differ: the comparison above can fail
    # --cost-noise: readings of exactly the true cost (no jitter, no outliers, factor 1) go through the table's
    # measure and observe paths and must choose as the exact table does; a dear reading changes what auto runs
    cand = (1, 4, 15)
    exact = simulate.serve(meta, groups, cand, n=3, seed=1)[2]
    assert simulate.serve(meta, groups, cand, n=3, seed=1, noise="inflate=4:1.0")[2] == exact
    assert simulate.serve(meta, groups, cand, n=3, seed=1, noise="inflate=1:3,inflate=4:3")[2][2] != exact[2]
    with pytest.raises(ValueError, match="unknown part 'spread=2'"):
        simulate.cost_noise("jitter=0.1,spread=2", 0)


def test_simulate_oracles_and_the_confidence_policy_on_a_known_table():
    """simulate.oracle_times and confidence_seconds on a request whose answers are known: budget 2 accepts 3
    tokens at the start (one 1.5 s round to the end, plus generate()'s 2 rounds past it), budget 1 needs 3 rounds
    of 1 s; a zero-weight confidence takes the cheapest budget, as a fixed budget does."""
    from examples.ddtree import simulate
    counts = np.array([[0, 3], [1, 1], [1, 1], [0, 0]])
    costs = {1: 1.0, 2: 1.5}
    myopic, planned = simulate.oracle_times(counts, costs, (1, 2), max_new=4)
    assert myopic == planned == 1.5 + 2 * 1.5
    fixed1, rounds = simulate.run_group(counts[:, None, :], (1, 2), costs, simulate.Fixed(1), max_new=4)
    assert (fixed1, rounds) == (5.0, 5)
    scores = np.full((4, 128), -np.inf, dtype=np.float32)
    assert simulate.confidence_seconds(counts, scores, costs, (1, 2), 0.0, max_new=4) == fixed1
    scores[:, 2] = 0.0  # node 2 certain: one more expected token at budget 2 (2 / 1.5 > 1 / 1)
    assert simulate.confidence_seconds(counts, scores, costs, (1, 2), 1.0, max_new=4) == 4.5
    rng = np.random.default_rng(3)  # planning the whole decode is never slower than choosing round by round
    for _ in range(20):
        c = np.sort(rng.integers(0, 5, (40, 4)), 1)
        m, p = simulate.oracle_times(c, {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.2}, (1, 2, 4, 8), max_new=40)
        assert p <= m + 1e-9


# ----------------------------------------------------------------------------- bad input

def test_bad_input_errors(models):
    target, drafter, cfg = models
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=2, max_prompt=20, max_new=8,
                      budget=15, top_k=4, **CPU)
    with pytest.raises(ValueError, match="prompt 1 has 40 tokens; this engine's cache takes prompts of at most 20"):
        e.admit([[32] * 10, [32] * 40])
    with pytest.raises(ValueError, match="at least 2"):
        e.admit([[32] * 10, [32]])
    with pytest.raises(ValueError, match="batch of 2"):
        e.admit([[32] * 10])
    small = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=4, max_prompt=20, max_new=8,
                          budget=15, top_k=4, num_pages=5, **CPU)
    with pytest.raises(ValueError, match="a batch of 4 requests needs 12 pages of 16 tokens but the cache has 5 free"):
        small.admit([[32] * 10] * 4)
    with pytest.raises(ValueError, match="budget 128 does not fit"):
        engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=1, max_prompt=20, max_new=8,
                      budget=128, top_k=4, **CPU)
    with pytest.raises(ValueError, match="backend"):
        engine.load_backend("triton")


def test_greedy_with_auto_budget(models, prompts):
    """budget 'auto' (chosen each step from measured costs and the drafter's confidence) stays lossless."""
    g = checks.greedy_equality(models, torch_ops, prompts[:3], max_new=24, budget="auto", top_k=4, **CPU)
    assert g["other_divergences"] == 0, g["requests"]
    e = engine.Engine(*models, torch_ops, mode="spec", batch_size=2, max_prompt=64, max_new=12, budget="auto",
                      top_k=4, **CPU)
    r = e.generate(prompts[:2])
    assert r.budgets and set(r.budgets) <= set(e.budgets) and e.costs.has(2, e.budgets)


def test_auto_warm_up_rounds_stay_within_the_requests_pages_and_columns(models):
    """Capture's eager warm-up runs every round (auto: one per budget). Run back to back from one
    `active` (the old warm-up ran the budgets' rounds after one drafter stage), requests advanced past max_new,
    their output columns and their pages: on the H200 at batch 64 (where some request accepts nearly the
    whole draft every round) a device-side assert; here an IndexError. Each round must run from the admitted
    state and leave it unchanged."""
    target, drafter, cfg = models
    B = 16
    ps = train.corpus_prompts("tiny", [30] * B, seed=5)
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=B, max_prompt=40, max_new=4,
                      budget="auto", top_k=8, **CPU)
    e.admit(ps)
    snap = e._snapshot()
    e._warm_rounds(passes=2)
    assert all(torch.equal(a, b) for a, b in zip(snap, e._snapshot()))
    assert len(e._rounds()) == len(e.budgets)
    r = e.generate(ps)
    assert len(r.budgets) == r.steps and set(r.budgets) <= set(e.budgets)


def test_auto_rounds_attend_as_the_fixed_budgets_rounds_do(models):
    """An auto round at budget n passes verify_attention the max_kv_len a fixed-budget engine at n passes (the
    auto cache is sized for the largest budget; verify_attention plans its KV split from this bound, so the
    cache's bound made auto's small-budget rounds dearer than the fixed ones). And the round's accepted
    counts are written into the policy's record in place (AutoBudget.accepted): stats[:, 0] is the step's
    acc_log row."""
    import types
    target, drafter, cfg = models
    seen = []

    def verify_attention(*a, **kw):
        seen.append((kw["max_tree_nodes"], kw["max_kv_len"]))
        return torch_ops.verify_attention(*a, **kw)

    ops = types.SimpleNamespace(**{n: getattr(torch_ops, n) for n in dir(torch_ops) if not n.startswith("_")})
    ops.verify_attention = verify_attention
    kw = dict(batch_size=2, max_prompt=40, max_new=12, top_k=8, **CPU)
    ps = train.corpus_prompts("tiny", [30, 37], seed=6)
    e = engine.Engine(target, drafter, cfg, ops, mode="spec", budget="auto", **kw)
    assert e.budgets[-1] > 16
    want = {}
    for b in e.budgets:
        f = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", budget=b, **kw)
        want[b] = f.M * f.page_size
        assert e._geometry(b)[5] == want[b]
    assert want[e.budgets[0]] < e.M * e.page_size  # the case this is about
    e.admit(ps)
    for b in e.budgets:
        seen.clear()
        e._run_round(b)
        assert seen and all(m == want[b] for _, m in seen), (b, seen)
        row = int(e.step_no) - 1
        assert e.autob.stats[:, 0].tolist() == e.acc_log[row].tolist()
    r = e.generate(ps)
    assert all(len(t) == 12 for t in r.tokens)


def test_alternate_takes_the_engines_in_turn_then_in_reverse(monkeypatch):
    """bench.alternate (run.py --auto-reps): each repetition measures every engine once, every other one in
    reverse order, so a machine that speeds up or slows down during the comparison favours none."""
    calls = []

    def fake_measure(e, groups, repeats):
        calls.append(e)
        return {"tokens_per_s": float(len(calls))}

    monkeypatch.setattr(bench, "measure", fake_measure)
    out = bench.alternate({"budget 16": "A", "budget 32": "B", "auto": "C"}, [["p"]], reps=3)
    assert "".join(calls) == "ABCCBAABC"
    assert out == {"budget 16": [1.0, 6.0, 7.0], "budget 32": [2.0, 5.0, 8.0], "auto": [3.0, 4.0, 9.0]}


def cfg_depth(e):
    return e.cfg.draft_depth


def test_measure_runs_a_built_engine_again(models, prompts):
    """bench.measure re-measures an engine throughput built (auto: its cost table, calibrated once, kept)."""
    groups = [prompts[:2]]
    kw = dict(max_new=12, top_k=4, device="cpu", dtype=torch.float32)
    r = bench.throughput(models, torch_ops, groups, mode="spec", budget="auto", graphs=False, repeats=1, **kw)
    e = r["engine"]
    assert r["budget"] == "auto" and set(r["costs_ms"]) == set(e.budgets)
    est = r["estimated_tokens_per_step"]
    assert list(est) == list(e.budgets) and all(1.0 <= x <= 1 + cfg_depth(e) for x in est.values())
    again = bench.measure(e, groups, repeats=1)
    assert again["engine"] is e and again["budget"] == "auto" and set(again["budgets_used"]) <= set(e.budgets)
    assert again["tokens_per_s"] == pytest.approx(2 * 12 / again["seconds"])
