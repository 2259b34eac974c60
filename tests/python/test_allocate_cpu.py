"""kdtree.integrations.allocate (batch-wide draft-node allocation) against a brute-force choice, and the DDTree
example's engine with alloc "batch": greedy decoding still equals autoregressive decoding."""
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kdtree.integrations.allocate import allocate, behind, nodes_by_budget, rank  # noqa: E402


def _scores(B, W, seed):
    # tree_build's scores: the root 0, then non-increasing path log-probabilities, -inf padding past `valid`
    g = np.random.default_rng(seed)
    s = -np.cumsum(g.exponential(1.0, (B, W)), 1)
    s[:, 0] = 0.0
    return torch.tensor(s, dtype=torch.float32)


@pytest.mark.parametrize("B,W,cap,total", [(1, 16, 15, 7), (4, 16, 15, 12), (8, 32, 31, 100), (16, 16, 12, 48),
                                           (5, 16, 15, 75), (3, 16, 15, 0)])
def test_allocate_keeps_the_batchs_most_likely_nodes(B, W, cap, total):
    scores = _scores(B, W, seed=B * 100 + total)
    active = torch.ones(B, dtype=torch.bool)
    a = allocate(scores, active, total, cap)
    drafts = (a.counts - 1).numpy()
    # brute force: the `total` largest scores of nodes 1..cap over the batch (no ties in random data)
    flat = [(float(scores[b, i]), b) for b in range(B) for i in range(1, cap + 1)]
    want = np.bincount([b for _, b in sorted(flat, reverse=True)[:total]], minlength=B)
    assert drafts.tolist() == want.tolist()
    assert drafts.sum() == total and (drafts <= cap).all()
    assert a.indptr.tolist() == [0] + np.cumsum(drafts + 1).tolist()
    rows = [(b, i) for b in range(B) for i in range(drafts[b] + 1)]
    assert list(zip(a.row_req.tolist(), a.row_node.tolist())) == rows


@pytest.mark.parametrize("ties", [False, True])
def test_nodes_by_budget_is_each_budgets_allocation(ties):
    """nodes_by_budget's column k is what allocate gives each request at budget k (cap caps[k]), equal scores
    included, from one tree's scores (built at the widest cap; narrower caps read its prefix)."""
    torch.manual_seed(3)
    B, W = 5, 32
    scores = -torch.rand(B, W).cumsum(1)
    if ties:
        scores = (scores * 2).round() / 2  # many equal path scores across requests
    active = torch.tensor([True, True, False, True, True])
    budgets, caps = (1, 2, 4, 8, 15, 16, 31), (15, 15, 15, 15, 15, 31, 31)
    for w in (None, behind(torch.tensor([40, 90, 0, 128, 7]))):  # likelihood alone, and weighted
        for round_budget, cap in ((4, 15), (16, 31)):  # the ranking reused at the round's cap, made at the other
            got = nodes_by_budget(allocate(scores, active, B * round_budget, cap, w), B * torch.tensor(budgets), caps)
            for k, (b, c) in enumerate(zip(budgets, caps)):
                assert got[:, k].tolist() == (allocate(scores, active, B * b, c, w).counts - 1).tolist(), (b, c)
            # a round whose every request takes its cap records from the ranking alone (allocate.rank)
            alone = nodes_by_budget(rank(scores, active, cap, w), B * torch.tensor(budgets), caps)
            assert torch.equal(alone, got)
    with pytest.raises(ValueError, match="non-decreasing"):
        nodes_by_budget(allocate(scores, active, B, 15), B * torch.tensor(budgets), (31, 15, 15, 15, 15, 31, 31))


@pytest.mark.parametrize("B", [5, 1])
def test_auto_budget_ranks_a_recorded_round_on_the_host_as_allocate_does(B):
    """AutoBudget with alloc_cap records a round's tree scores (one copy on the device); the host's ranking of
    them (weighted by its own generated counts, which are the round's) gives each budget's draft nodes exactly
    as nodes_by_budget over the device's allocation at the round's weights, at a packed round (budget 4) and at
    a width-filling one (15, 31: the uniform round), ties and a request that is not decoding included. A batch
    of one skips the ranking (its allocation is each budget's whole) and must still agree."""
    from kdtree.integrations.budget import AutoBudget, CostTable
    torch.manual_seed(11)
    depth, budgets = 6, (2, 4, 8, 15, 31)
    caps = [15, 15, 15, 15, 31]
    auto = AutoBudget(budgets, CostTable(), "cpu", depth=depth, alloc_cap=lambda b: caps[budgets.index(b)])
    auto.reset(B, max_new=40)
    auto.gen[:] = [3, 17, 40, 9, 30][:B]  # request 2 is done
    active = torch.tensor([True, True, False, True, True][:B])
    accepted = torch.where(active, torch.tensor([2, 0, 1, 3, 1][:B], dtype=torch.int32), -1)
    path = torch.zeros(B, depth + 1, dtype=torch.int32)
    for used, W in ((4, 16), (15, 16), (31, 32)):
        scores = (-torch.rand(B, W).cumsum(1) * 2).round() / 2  # non-increasing, many ties
        scores[:, 0] = 0.0
        auto.record(accepted, path, scores)
        got = auto.alloc_nodes(auto.stats.numpy(), used)
        w = behind(torch.from_numpy(40 - auto.gen))
        cap = caps[budgets.index(used)]
        want = nodes_by_budget(allocate(scores, active, B * used, cap, w), B * torch.tensor(budgets), caps)
        assert got.tolist() == want.tolist(), used
    with pytest.raises(ValueError, match="need their tree scores"):
        auto.record(accepted, path)


def test_allocate_gives_done_requests_nodes_last():
    B, W, cap = 4, 16, 15
    scores = _scores(B, W, seed=7)
    scores[1, 1:] = 0.0  # the most likely nodes of the batch, but request 1 is done
    active = torch.tensor([True, False, True, True])
    a = allocate(scores, active, 20, cap)
    assert int(a.counts[1]) == 1  # only its root: the decoding requests had room for all 20
    a = allocate(scores, active, 3 * cap + 2, cap)
    assert (a.counts - 1).tolist() == [cap, 2, cap, cap]  # full caps first, then the done request


def test_behind_gives_the_nodes_to_the_requests_furthest_behind():
    """allocate with behind(remaining): a node's value is its probability times its request's weight
    (remaining / the most remaining) ** URGENCY; over equal trees the request furthest behind takes the most
    nodes and the one furthest ahead the fewest."""
    B, W, cap = 3, 16, 15
    scores = _scores(1, W, seed=5).expand(B, W).contiguous()
    active = torch.ones(B, dtype=torch.bool)
    w = behind(torch.tensor([60, 120, 90]))
    assert w.tolist()[1] == 0.0 and w[0] < w[2] < 0
    a = allocate(scores, active, 20, cap, w)
    c = (a.counts - 1).tolist()
    assert c[1] > c[2] > c[0] and sum(c) == 20
    # brute force over the weighted scores
    key = [(float(scores[b, i] + w[b]), -b) for b in range(B) for i in range(1, cap + 1)]
    want = np.bincount([-nb for _, nb in sorted(key, reverse=True)[:20]], minlength=B)
    assert (a.counts - 1).tolist() == want.tolist()
    assert torch.equal(behind(torch.tensor([0, -3, 5])), behind(torch.tensor([1, 1, 5])))  # done: as 1 left
    with pytest.raises(ValueError, match=r"log_weight must be \[3\]"):
        allocate(scores, active, 4, cap, torch.zeros(2))


def test_allocate_errors_name_the_argument():
    s = _scores(2, 16, 0)
    act = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="cap must be 1..15"):
        allocate(s, act, 4, 16)
    with pytest.raises(ValueError, match="total must be 0..30"):
        allocate(s, act, 31, 15)
    with pytest.raises(ValueError, match=r"active must be \[2\]"):
        allocate(s, torch.ones(3, dtype=torch.bool), 4, 15)


# ----------------------------------------------------------------------------- the engine with alloc "batch"

from examples.ddtree import checks, engine, torch_ops, train  # noqa: E402

CPU = dict(device="cpu", dtype=torch.float32, page_size=16)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    import os
    old = os.environ.get("KDTREE_DDTREE_CACHE")
    os.environ["KDTREE_DDTREE_CACHE"] = str(tmp_path_factory.mktemp("ddtree-cache"))
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, drafter, cfg, _ = train.get_models("tiny", "cpu", log=lambda *a: None)
    finally:
        torch.set_num_threads(n)
        if old is None:
            del os.environ["KDTREE_DDTREE_CACHE"]
        else:
            os.environ["KDTREE_DDTREE_CACHE"] = old
    return target, drafter, cfg


@pytest.mark.parametrize("budget", [2, 6])
def test_greedy_with_batch_allocation_equals_autoregressive(models, budget):
    prompts = train.corpus_prompts("tiny", [20, 33, 50, 7, 41, 12], seed=3)
    g = checks.greedy_equality(models, torch_ops, prompts, max_new=40, budget=budget, top_k=4, alloc="batch", **CPU)
    assert g["other_divergences"] == 0, g["requests"]
    assert g["near_tie_divergences"] <= 1, g["requests"]
    assert g["mean_tokens_per_step"] > 1.2


def test_batch_allocation_rounds_pack_the_allocated_trees(models):
    # One round by hand: the packed rows are each request's first counts[b] nodes of its cap-wide tree, the
    # round's nodes total B x budget, and accepting moves each request by its accepted count + 1.
    target, drafter, cfg = models
    prompts = train.corpus_prompts("tiny", [20, 33, 50, 7], seed=5)
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=4, max_prompt=50, max_new=16,
                      budget=3, top_k=4, alloc="batch", **CPU)
    assert e.cap == 15 and e.room == 16
    e.admit(prompts)
    kv0 = e.kv_lens.clone()
    stages = dict(e.stages())
    for name in ("drafter", "tree_build", "allocate", "target"):
        stages[name]()
    t, a = e.s["tree"], e.s["alloc"]
    assert int(a.counts.sum()) == 4 * (3 + 1) and int(a.indptr[-1]) == 16
    for b in range(4):
        rows = range(int(a.indptr[b]), int(a.indptr[b + 1]))
        assert [int(a.row_node[r]) for r in rows] == list(range(int(a.counts[b])))
        assert torch.equal(e.s["pos"][list(rows)], t.positions[b, : int(a.counts[b])])
    for name in ("sample_tokens", "tree_accept", "kv_compact", "update"):
        stages[name]()
    assert torch.equal(e.kv_lens, kv0 + e.s["acc"] + 1)
    assert (e.s["acc"] <= a.counts - 1).all()


def test_batch_allocation_with_auto_budget(models):
    # budget "auto" over allocated rounds: the policy reads each request's draft nodes from the round's record
    target, drafter, cfg = models
    prompts = train.corpus_prompts("tiny", [20, 33, 50, 7, 41, 12], seed=3)
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=6, max_prompt=50, max_new=24,
                      budget="auto", top_k=4, alloc="batch", auto_budgets=(2, 4, 8, 15), **CPU)
    assert e.autob.alloc_caps == [15, 15, 15, 15] and e.room == 16
    r = e.generate(prompts)
    ar = engine.Engine(target, drafter, cfg, torch_ops, mode="ar", batch_size=6, max_prompt=50, max_new=24, **CPU)
    assert r.tokens == ar.generate(prompts).tokens  # float32 on the CPU: no near-ties
    assert set(r.budgets) <= {2, 4, 8, 15}
    assert e.autob.stats.shape == (6, 1 + cfg.draft_depth + 16)  # the tree scores of a cap-15 round


def test_batch_allocation_of_one_request_runs_the_uniform_round(models):
    # one request takes the whole allocation (its budget): the engine runs the uniform round, without the ranking
    target, drafter, cfg = models
    prompts = train.corpus_prompts("tiny", [20], seed=3)
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=1, max_prompt=50, max_new=24,
                      budget="auto", top_k=4, alloc="batch", auto_budgets=(2, 4, 8), **CPU)
    assert e.alloc == "request" and e.autob.alloc_caps is None
    assert "allocate" not in dict(e.stages(4))
    fixed = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=1, max_prompt=50, max_new=24,
                          budget=4, top_k=4, **CPU)
    assert e.generate(prompts).tokens == fixed.generate(prompts).tokens


def test_batch_allocation_at_a_width_filling_budget_runs_the_uniform_round(models):
    # budget 15 over trees of width 16: B x 15 nodes give every request its cap, which is the uniform round
    target, drafter, cfg = models
    prompts = train.corpus_prompts("tiny", [20, 33, 50, 7], seed=5)
    e = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=4, max_prompt=50, max_new=16,
                      budget=15, top_k=4, alloc="batch", **CPU)
    assert e.alloc == "batch" and "allocate" not in dict(e.stages())
    assert "allocate" in dict(e.stages(4))
    ref = engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=4, max_prompt=50, max_new=16,
                        budget=15, top_k=4, **CPU)
    r, want = e.generate(prompts), ref.generate(prompts)
    assert r.tokens == want.tokens and r.steps == want.steps


def test_batch_allocation_rejects_an_unknown_mode(models):
    target, drafter, cfg = models
    with pytest.raises(ValueError, match="alloc must be"):
        engine.Engine(target, drafter, cfg, torch_ops, mode="spec", batch_size=2, max_prompt=20, max_new=8,
                      budget=4, top_k=4, alloc="global", **CPU)


def test_simulated_allocation_on_a_known_round():
    """simulate.allocated_round: two requests, the first certain of its chain (scores near 0) and accepting it
    all, the second unsure (low scores) and accepting one node. Six nodes over the batch go five to the first
    (all of its cap) and one to the second; both accept what they have."""
    from examples.ddtree import simulate
    scores = np.full((2, 128), -np.inf, dtype=np.float32)
    scores[0, :6] = [0, -0.01, -0.02, -0.03, -0.04, -0.05]
    scores[1, :6] = [0, -1.0, -2.0, -3.0, -4.0, -5.0]
    paths = np.array([[1, 2, 3, 4, 5, 6], [1, -1, -1, -1, -1, -1]])
    active = np.array([True, True])
    acc, counts = simulate.allocated_round(paths, scores, active, 3, (1, 2, 3))
    assert acc.tolist() == [5, 1]  # uniform 3 each would accept 3 and 1: the same rows, two tokens fewer
    # what budgets 1 and 2 would have accepted under their own allocations: 2 and 4 nodes, all the first's
    assert counts.tolist() == [[2, 4, 5], [0, 0, 1]]
    acc, _ = simulate.allocated_round(paths, scores, np.array([False, True]), 3, (3,))
    assert acc.tolist() == [1, 1]  # a done request takes nodes last: one, the second five
    # run_group's cap at budget b: its width's largest (engine.Engine.cap_of over the trace's 127-node trees)
    assert [engine.tree_width(b) - 1 for b in (3, 16, 127)] == [15, 31, 127]
