"""GPU tests of the DDTree example with the kdtree backend (the H200 model of examples/ddtree, loaded
from the weight cache that scripts/device_ddtree.sh fills; KDTREE_DDTREE_TRAIN=1 trains it here).

They skip, saying why, without a CUDA device or without an importable kdtree package.
  python -m pytest -q tests/python/test_ddtree_gpu.py
"""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.ddtree import checks, engine, torch_ops, train  # noqa: E402


def _skip_reason():
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to torch {torch.__version__} (DDTree GPU tests skipped, not passed)"
    try:
        import kdtree  # noqa: F401
    except Exception as e:  # the package or its library is missing
        return f"the kdtree package cannot be imported ({e}); DDTree GPU tests skipped, not passed"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))]

BUDGET, TOP_K = 63, 8
GPU = dict(device="cuda", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def kd():
    import kdtree
    return kdtree


@pytest.fixture(scope="module")
def models_f32():
    # Training takes ~2 minutes: done by scripts/device_ddtree.sh (python -m examples.ddtree.run trains
    # and caches first), or here when KDTREE_DDTREE_TRAIN=1; a plain `pytest tests/python` on a GPU
    # machine without cached weights skips the model tests instead of training inside the suite.
    import os
    if not train.weights_cached("h200") and os.environ.get("KDTREE_DDTREE_TRAIN") != "1":
        pytest.skip(f"no cached DDTree weights under {train.cache_dir()} (scripts/device_ddtree.sh trains them; "
                    "or set KDTREE_DDTREE_TRAIN=1): model tests skipped, not passed")
    target, drafter, cfg, _ = train.get_models("h200", "cuda", log=lambda *a: print(*a, flush=True))
    return target, drafter, cfg


@pytest.fixture(scope="module")
def models(models_f32):
    import copy
    target, drafter, cfg = models_f32
    return copy.deepcopy(target).to(torch.bfloat16), copy.deepcopy(drafter).to(torch.bfloat16), cfg


# ----------------------------------------------------------------------------- kdtree ops vs the torch backend

@pytest.mark.parametrize("W,budget", [(32, 16), (64, 63), (128, 127)])
def test_tree_ops_match_torch_backend(kd, W, budget):
    """tree_build[W], tree_accept[W], kv_compact[mla576,page=64,bf16] and sample_tokens: kdtree on the
    GPU equals the plain-torch backend exactly (sampling: all but rare last-ulp ties)."""
    g = torch.Generator().manual_seed(W)
    B, D, K, V = 5, 16, 8, 256
    lp = torch.log_softmax(torch.randn(B, D, V, generator=g) * 3, -1)
    vals, idx = lp.topk(K, -1)
    dt, dlp = idx.int().cuda(), vals.cuda()
    roots = torch.randint(0, V, (B,), generator=g).int().cuda()
    prefix = torch.tensor([0, 63, 64, 200, 1000], dtype=torch.int32).cuda()
    a = kd.tree_build(dt, dlp, roots, prefix, budget=budget, max_tree_nodes=W)
    b = torch_ops.tree_build(dt, dlp, roots, prefix, budget=budget, max_tree_nodes=W)
    for name in a._fields:
        if name != "scores":
            assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name
    n = budget + 1
    logits = torch.randn(B * n, V, generator=g).cuda() * 2
    for temp in (0.0, 1.0):
        offs = torch.arange(B * n, dtype=torch.int64).cuda() * 977 + 5
        tk = kd.sample_tokens(logits, temperature=temp, seed=17, row_offsets=offs)
        tt = torch_ops.sample_tokens(logits, temperature=temp, seed=17, row_offsets=offs)
        assert (tk == tt).float().mean().item() >= 0.99
    # targets that follow the tree for a while: the target token at node i is a child's token half the time
    tgt = torch.randint(0, V, (B, n), generator=g).int()
    tok = a.tokens.cpu()
    par = a.parents.cpu()
    for bb in range(B):
        for i in range(n):
            kids = [j for j in range(n) if par[bb, j] == i and j > 0]
            if kids and (bb + i) % 2 == 0:
                tgt[bb, i] = tok[bb, kids[(i + bb) % len(kids)]]
    indptr = (torch.arange(B + 1, dtype=torch.int32) * n).cuda()
    ra = kd.tree_accept(a.tokens, a.parents, a.node_counts, tgt.flatten().cuda(), node_indptr=indptr)
    rb = torch_ops.tree_accept(a.tokens, a.parents, a.node_counts, tgt.flatten().cuda(), node_indptr=indptr)
    for x, y in zip(ra, rb):
        assert torch.equal(x.cpu(), y.cpu())
    # kv_compact on a 2-layer MLA cache with scattered pages
    P, page, M = 128, 64, 20
    cache = torch.randn(2, P, page, 576, generator=g).to(torch.bfloat16).cuda()
    table = torch.randperm(P, generator=g)[:B * M].view(B, M).int().cuda()
    kv = prefix + n
    c1, c2 = cache.clone(), cache.clone()
    kd.kv_compact(c1, table, kv, a.node_counts, ra[0], ra[1])
    torch_ops.kv_compact(c2, table, kv, a.node_counts, ra[0], ra[1])
    assert torch.equal(c1, c2)

@pytest.mark.parametrize("B", [1, 64])
def test_prefix_tree_of_kdtree_tree_build_equals_its_build_at_each_budget(kd, B):
    """budget auto's counterfactual counts: kdtree's tree_build at 127 (W = 128), cut to each candidate budget by
    kdtree.integrations.budget.prefix_tree, equals kdtree's tree_build at that budget and width, every
    output (also on the CUDA graph path: prefix_tree is plain torch ops without a host read)."""
    from kdtree.integrations import budget as kb
    g = torch.Generator().manual_seed(B)
    D, K, V = 16, 8, 256
    lp = torch.log_softmax(torch.randn(B, D, V, generator=g) * 3, -1)
    vals, idx = lp.topk(K, -1)
    dt, dlp = idx.int().cuda(), vals.cuda()
    roots = torch.randint(0, V, (B,), generator=g).int().cuda()
    prefix = torch.randint(0, 2000, (B,), generator=g).int().cuda()
    big = kd.tree_build(dt, dlp, roots, prefix, budget=127, max_tree_nodes=128)
    for n in kb.DEFAULT_BUDGETS:
        W = engine.tree_width(n)
        direct = kd.tree_build(dt, dlp, roots, prefix, budget=n, max_tree_nodes=W)
        for name, a, b in zip(direct._fields, kb.prefix_tree(big, n, W), direct):
            assert torch.equal(a, b), (name, n)


def test_verify_attention_matches_torch_backend(kd):
    """verify_attention[mla576/512,W=64,page=64,bf16] with a real tree against the torch backend."""
    g = torch.Generator().manual_seed(1)
    B, W, budget, H = 4, 64, 63, 16
    lp = torch.log_softmax(torch.randn(B, 16, 256, generator=g) * 3, -1).topk(8, -1)
    prefix = torch.tensor([5, 64, 700, 1500], dtype=torch.int32)
    t = torch_ops.tree_build(lp.indices.int(), lp.values, torch.zeros(B, dtype=torch.int32), prefix, budget=budget,
                             max_tree_nodes=W)
    n = budget + 1
    P, page, M = 128, 64, 32
    cache = (torch.randn(P, page, 576, generator=g)).to(torch.bfloat16).cuda()
    table = torch.randperm(P, generator=g)[:B * M].view(B, M).int().cuda()
    kv = (prefix + n).int().cuda()
    q = torch.randn(B * n, H, 576, generator=g).to(torch.bfloat16).cuda()
    mask = t.tree_mask[:, :n].reshape(B * n, 1).cuda()
    indptr = (torch.arange(B + 1, dtype=torch.int32) * n).cuda()
    o1 = kd.verify_attention(q, cache, table, kv, indptr, mask, max_tree_nodes=W, sm_scale=0.072)
    o2 = torch_ops.verify_attention(q, cache, table, kv, indptr, mask, max_tree_nodes=W, sm_scale=0.072)
    err = ((o1.float() - o2.float()).norm() / o2.float().norm()).item()
    assert err < 1e-2, err


# ----------------------------------------------------------------------------- the serving loop

_greedy_runs = {}


def _greedy(kd, mdl, model_dtype):
    """checks.greedy_equality over the 32 requests, once per model dtype (the float32 test compares its
    numeric noise with the bf16 run's); prints each divergence with its margin and the noise."""
    if model_dtype not in _greedy_runs:
        prompts = train.corpus_prompts("h200", [40, 77, 130, 224, 33, 190, 64, 100] * 4, seed=5)
        g = checks.greedy_equality(mdl, kd, prompts, max_new=256, budget=BUDGET, top_k=TOP_K, **GPU)
        print(f"{model_dtype} model: {g['equal']}/{len(prompts)} identical, numeric margin noise "
              f"{g['numeric_margin_noise']:.3e}, {g['mean_tokens_per_step']:.2f} tokens/step")
        for r in g["requests"]:
            if not r["equal"]:
                print(f"  request {r['request']}: first divergence at token {r['first_divergence']}, top-2 margin "
                      f"{r['ar_margin']:.3e} (AR) / {r['spec_margin']:.3e} (spec) vs noise "
                      f"{g['numeric_margin_noise']:.3e}: {'near-tie' if r['near_tie'] else 'NOT a near-tie'}")
        _greedy_runs[model_dtype] = g
    return _greedy_runs[model_dtype]


@pytest.mark.parametrize("model_dtype,max_diverging", [("bfloat16", 1 / 2), ("float32", 1 / 4)])
def test_greedy_speculative_equals_autoregressive_gpu(kd, models, models_f32, model_dtype, max_diverging):
    """greedy[budget=63, 32 requests x 256 tokens, bf16 KV cache and attention; model bf16 or float32].

    Every divergence must be at a near-tie: the target's top-2 margin there is within the numeric
    noise of the margin measured in the same run (the largest |margin_AR - margin_spec| where the runs
    agree; AR and the tree compute the same logits with different batch shapes, which round
    differently). A wrong tree, mask, position or compaction diverges at a clear margin instead.

    How many requests may diverge at a near-tie: the count is binomial over the requests, and a
    request's chance p grows with the noise (a position flips only when its margin is within the
    noise, and margins near 0 have a roughly flat density), times its 256 positions.
    bf16 model: the H200 runs measured 8/32 and 6/32 (p ~ 0.22: mean 7, sd 2.3 over 32 requests);
    the bound 16 (1/2) is ~4 sd above that mean. float32 model (only the KV rows and attention
    outputs rounded to bf16, versus every activation in the bf16 model): its noise must be below the
    bf16 run's (asserted: the premise of a lower p), and the bound is half the bf16 one (8 of 32).
    Not yet measured on the H200 when written; the run prints the count, the margins and the noise."""
    mdl = models_f32 if model_dtype == "float32" else models
    g = _greedy(kd, mdl, model_dtype)
    n = len(g["requests"])
    bad = [r for r in g["requests"] if r["near_tie"] is False]
    assert not bad, (f"divergences that are not near-ties (numeric margin noise {g['numeric_margin_noise']:.4f})", bad)
    assert g["near_tie_divergences"] <= n * max_diverging, g["requests"]
    assert g["mean_tokens_per_step"] > 1.5  # the drafter is predictive (the script reports the figure)
    if model_dtype == "float32":
        g16 = _greedy(kd, models, "bfloat16")
        assert g["numeric_margin_noise"] < g16["numeric_margin_noise"], (g["numeric_margin_noise"],
                                                                          g16["numeric_margin_noise"])


def test_cuda_graph_replay_equals_eager(kd, models):
    target, drafter, cfg = models
    prompts = train.corpus_prompts("h200", [50, 120, 80, 200], seed=8)
    outs = []
    for graphs in (False, True):
        e = engine.Engine(target, drafter, cfg, kd, mode="spec", batch_size=4, max_prompt=200, max_new=96,
                          budget=BUDGET, top_k=TOP_K, **GPU)
        if graphs:
            e.admit(prompts)
            e.capture()
        outs.append(e.generate(prompts).tokens)
    assert outs[0] == outs[1]


def test_auto_budget_graphs_at_batch_64(kd, models):
    """budget auto with CUDA graphs at batch 64 (one graph per budget): capture's warm-up and the
    decoding stay within every request's pages and output columns (this was a device-side assert), every
    request finishes, and two decodings of the same prompts give the same tokens."""
    target, drafter, cfg = models
    prompts = train.corpus_prompts("h200", [40 + 3 * i for i in range(64)], seed=10)
    e = engine.Engine(target, drafter, cfg, kd, mode="spec", batch_size=64, max_prompt=240, max_new=128,
                      budget="auto", top_k=TOP_K, **GPU)
    e.admit(prompts)
    e.capture()
    assert set(e.graphs) == set(e.budgets)
    runs = [e.generate(prompts) for _ in range(2)]
    torch.cuda.synchronize()
    for r in runs:
        assert len(r.budgets) == r.steps and set(r.budgets) <= set(e.budgets), r.budgets
        assert all(len(t) == 128 for t in r.tokens)
    print("auto at batch 64: budgets", runs[1].budgets, "costs ms", {b: round(1e3 * s, 3) for b, s in
                                                                    e.costs.row(64).items()})
    assert runs[0].tokens == runs[1].tokens or runs[0].budgets != runs[1].budgets

def test_batch_allocation_gpu(kd, models_f32):
    """alloc "batch" on the kdtree ops (budget 4 at batch 16: 64 draft nodes over the batch, trees built at 15):
    greedy decoding equals autoregressive decoding but at near-ties (float32 model, bf16 cache and attention; the
    bound of test_greedy_speculative_equals_autoregressive_gpu's float32 case), and a CUDA-graph decode gives the
    eager decode's tokens. Passed on an H100 (stop 41; stop 42 with the nodes weighted by tokens left)."""
    target, drafter, cfg = models_f32
    prompts = train.corpus_prompts("h200", [40 + 11 * i for i in range(16)], seed=12)
    g = checks.greedy_equality(models_f32, kd, prompts, max_new=96, budget=4, top_k=TOP_K, alloc="batch", **GPU)
    bad = [r for r in g["requests"] if r["near_tie"] is False]
    assert not bad, (f"divergences that are not near-ties (numeric margin noise {g['numeric_margin_noise']:.4f})", bad)
    assert g["near_tie_divergences"] <= len(prompts) / 4, g["requests"]
    outs = []
    for graphs in (False, True):
        e = engine.Engine(target, drafter, cfg, kd, mode="spec", batch_size=16, max_prompt=215, max_new=96,
                          budget=4, top_k=TOP_K, alloc="batch", **GPU)
        if graphs:
            e.admit(prompts)
            e.capture()
        outs.append(e.generate(prompts).tokens)
    assert outs[0] == outs[1]


def test_sampling_distribution_matches_autoregressive_gpu(kd, models):
    prompt = train.corpus_prompts("h200", [120], seed=9)[0]
    r = checks.sampling_tv(models, kd, prompt, n_samples=4096, budget=BUDGET, top_k=TOP_K, **GPU)
    print(r)
    for name, st in r["stats"].items():
        assert st["tv"] <= st["threshold"], (name, st)
    # Same streams: the coupled draws agree except where bf16 differences flip a perturbed near-tie;
    # far more often than independent streams agree by chance.
    chance = r["independent_identical_fraction"]
    assert r["coupled_identical_fraction"] >= chance + 0.5 * (1 - chance), r
