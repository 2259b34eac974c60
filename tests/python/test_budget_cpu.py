"""CPU tests of kdtree.integrations.budget (budget "auto"): the budget-n tree cut out of the largest tree equals
the tree tree_build builds at n (every output), the device-side numbers a round records, and the host-side
policy that reads them lag rounds late. The torch reference backend (kdtree.integrations.torch_ops) builds
the trees; tests/python/test_ddtree_gpu.py checks kdtree's own tree_build the same way."""
import pytest

torch = pytest.importorskip("torch")

from kdtree.integrations import budget as kb  # noqa: E402
from kdtree.integrations import torch_ops  # noqa: E402


def _width(nodes):
    for w in (16, 32, 64, 128):
        if nodes <= w:
            return w
    raise ValueError(nodes)


def _draft(B, D, K, seed, ties=False, vocab=97):
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(B, D, vocab, generator=g) * 2, -1)
    if ties:  # coarse log-probs: many exact score ties, so the depth and rank-path tie rules decide
        lp = (lp * 2).round() / 2
    vals, idx = lp.topk(K, dim=-1)
    return idx.to(torch.int32), vals.contiguous()


CASES = [  # B, D, K, seed, ties
    (3, 16, 8, 1, False), (4, 6, 8, 2, False), (2, 16, 4, 3, True), (5, 3, 2, 4, False),  # 3x2: 14 nodes at most
    (1, 16, 1, 5, False), (3, 8, 64, 6, True), (64, 16, 8, 7, False),
]


@pytest.mark.parametrize("B,D,K,seed,ties", CASES)
def test_prefix_tree_equals_tree_built_at_that_budget(B, D, K, seed, ties):
    dt, dlp = _draft(B, D, K, seed, ties)
    g = torch.Generator().manual_seed(seed + 1000)
    roots = torch.randint(0, 97, (B,), generator=g, dtype=torch.int32)
    prefix = torch.randint(0, 500, (B,), generator=g, dtype=torch.int32)
    big = torch_ops.tree_build(dt, dlp, roots, prefix, budget=127, max_tree_nodes=128)
    for n in (1, 2, 3) + kb.DEFAULT_BUDGETS:
        W = _width(n + 1)
        direct = torch_ops.tree_build(dt, dlp, roots, prefix, budget=n, max_tree_nodes=W)
        cut = kb.prefix_tree(big, n, W)
        assert type(cut) is type(direct)
        for name, a, b in zip(direct._fields, cut, direct):
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous(), (name, n)
            assert torch.equal(a, b), (name, n, W)
        # and from an intermediate width (a tree built at 63 in W = 64)
        if n <= 63:
            mid = torch_ops.tree_build(dt, dlp, roots, prefix, budget=63, max_tree_nodes=64)
            assert all(torch.equal(a, b) for a, b in zip(kb.prefix_tree(mid, n, W), direct)), n


def test_prefix_tree_rejects_a_budget_the_tree_cannot_hold():
    dt, dlp = _draft(2, 4, 4, 9)
    z = torch.zeros(2, dtype=torch.int32)
    t = torch_ops.tree_build(dt, dlp, z, z, budget=31, max_tree_nodes=32)
    with pytest.raises(ValueError, match="budget"):
        kb.prefix_tree(t, 40, 64)
    with pytest.raises(ValueError, match="budget"):
        kb.prefix_tree(t, 16, 16)


def test_auto_budget_probe_rounds_cut_the_largest_tree_and_record_predictions():
    B, D, K = 6, 8, 8
    dt, dlp = _draft(B, D, K, 11)
    roots = torch.arange(B, dtype=torch.int32)
    prefix = torch.full((B,), 40, dtype=torch.int32)
    costs = kb.CostTable()
    for b, s in zip(kb.DEFAULT_BUDGETS, (1.0, 1.0, 1.1, 1.3, 1.8, 3.0)):
        costs.set(B, b, s)
    auto = kb.AutoBudget(kb.DEFAULT_BUDGETS, costs, "cpu", probe_every=3)
    auto.reset(B)
    plans = [auto.plan()[1] for _ in range(7)]
    assert plans == [True, False, False, True, False, False, True]
    tree, big = auto.build_tree(torch_ops, dt, dlp, roots, prefix, 16, True, _width)
    direct = torch_ops.tree_build(dt, dlp, roots, prefix, budget=16, max_tree_nodes=32)
    assert all(torch.equal(a, b) for a, b in zip(tree, direct)) and big.tokens.shape == (B, 128)
    tree2, none = auto.build_tree(torch_ops, dt, dlp, roots, prefix, 16, False, _width)
    assert none is None and all(torch.equal(a, b) for a, b in zip(tree2, direct))
    active = torch.tensor([True, True, False, True, True, True])
    acc = torch.tensor([3, 1, 9, 0, 2, 5], dtype=torch.int32)
    auto.record(active, acc, torch.tensor(False), big)
    row = auto.stats.tolist()
    want = (kb.expected_accepts(big.scores, kb.DEFAULT_BUDGETS) * active[:, None]).sum(0)
    assert row[:4] == [1.0, 5.0, 11.0, 0.0]
    assert torch.allclose(torch.tensor(row[4:]), want)
    assert auto.observe(row, 16) is False
    pol = auto.policy
    assert pol._ema == pytest.approx(want.tolist()) and pol._active == 5.0
    assert auto.policy.current(B) == pol.best(want.tolist(), 5, B)
    # a plain round: the head only, predictions kept from before; "all done" read back
    auto.record(active, acc, torch.tensor(True))
    row2 = auto.stats.tolist()
    assert row2[0] == 0.0 and row2[3] == 1.0
    assert auto.observe(row2, 16) is True and pol._ema == pytest.approx(want.tolist())


def test_policy_reads_probes_and_calibrates():
    costs = kb.CostTable()
    for b, s in ((1, 1.0), (3, 1.1), (7, 2.0)):
        costs.set(2, b, s)
    pol = kb.BudgetPolicy((1, 3, 7), costs, prior=1.0, smoothing=1.0)
    assert pol.current(2) is None
    # (2 + 1.1)/1, (2 + 2.55)/1.1, (2 + 2.76)/2 -> 3
    pol.observe_probe([1.1, 2.55, 2.76], 2)
    assert pol.current(2) == 3
    # the drafter predicted far more than was accepted: smaller trees
    for _ in range(5):
        pol.observe_probe([1.1, 2.55, 2.76], 2, accepted=0.0, used=3)
    assert pol.correction < 0.2 and pol.current(2) == 1


def test_cost_table_is_made_non_decreasing():
    t = kb.CostTable()
    times = {4: [1.0], 8: [0.9], 16: [1.2], 32: [1.1], 64: [2.0]}
    t.measure(1, list(times), lambda b: times[b][0], repeats=3)
    assert [t.get(1, b) for b in (4, 8, 16, 32, 64)] == [1.0, 1.0, 1.2, 1.2, 2.0]
