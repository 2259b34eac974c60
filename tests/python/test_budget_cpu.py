"""CPU tests of kdtree.integrations.budget (budget "auto"): the budget-n tree cut out of the largest tree equals
the tree tree_build builds at n (every output), so a round's accepted path tells what every smaller budget
would have accepted (counterfactual_accepts, checked against tree_accept); the numbers a round records; the
host-side policy that reads them lag rounds late, on synthetic acceptance with the H200's cost rows. The torch reference backend (kdtree.integrations.torch_ops) builds
the trees; tests/python/test_ddtree_gpu.py checks kdtree's own tree_build the same way."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kdtree.integrations import budget as kb  # noqa: E402
from kdtree.integrations import torch_ops  # noqa: E402


# auto's former candidates (before the width-filling ones), which the H200 cost rows below were measured at.
SIX = (4, 8, 16, 32, 64, 127)


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


def _cost_table(batch, budgets, seconds):
    """A CostTable row for `batch`: seconds[i] a step at budgets[i]."""
    costs = kb.CostTable()
    for b, t in zip(budgets, seconds):
        costs.set(batch, b, t)
    return costs


def _policy(batch, budgets, seconds):
    """A BudgetPolicy over `budgets` with _cost_table's row for `batch`, its requests' statistics sized for it."""
    pol = kb.BudgetPolicy(budgets, _cost_table(batch, budgets, seconds))
    pol.requests(batch)
    return pol


@pytest.mark.parametrize("B,D,K,seed,ties", CASES)
def test_prefix_tree_equals_tree_built_at_that_budget(B, D, K, seed, ties):
    dt, dlp = _draft(B, D, K, seed, ties)
    g = torch.Generator().manual_seed(seed + 1000)
    roots = torch.randint(0, 97, (B,), generator=g, dtype=torch.int32)
    prefix = torch.randint(0, 500, (B,), generator=g, dtype=torch.int32)
    big = torch_ops.tree_build(dt, dlp, roots, prefix, budget=127, max_tree_nodes=128)
    for n in sorted({1, 2, 3, 16, 32, 64} | set(kb.DEFAULT_BUDGETS)):
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


def _target_tokens(tree, seed, follow=0.95, vocab=97):
    """A target token per node of `tree` (flattened [B * W]): with probability `follow` the token of one of the
    node's children (so paths get accepted), else a random token."""
    g = torch.Generator().manual_seed(seed)
    B, W = tree.tokens.shape
    t = torch.randint(0, vocab, (B, W), generator=g, dtype=torch.int32)
    for b in range(B):
        for i in range(int(tree.node_counts[b])):
            kids = [j for j in range(W) if int(tree.parents[b, j]) == i]
            if kids and float(torch.rand((), generator=g)) < follow:
                t[b, i] = tree.tokens[b, kids[int(torch.randint(len(kids), (), generator=g))]]
    return t


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_counterfactual_accepts_equal_tree_accept_at_every_smaller_budget(seed):
    """A round verified at 127: the accepted path's nodes of index <= m are what the budget-m tree (its first
    m + 1 nodes, the target's tokens at them unchanged) accepts, for every m."""
    B, D, K = 5, 16, 8
    dt, dlp = _draft(B, D, K, 40 + seed)
    roots = torch.arange(B, dtype=torch.int32)
    prefix = torch.full((B,), 30, dtype=torch.int32)
    big = torch_ops.tree_build(dt, dlp, roots, prefix, budget=127, max_tree_nodes=128)
    ttok = _target_tokens(big, seed)
    path, acc, _ = torch_ops.tree_accept(big.tokens, big.parents, big.node_counts, ttok.flatten(),
                                         node_indptr=torch.arange(B + 1, dtype=torch.int32) * 128)
    assert int(acc.max()) >= 2  # the check has paths to cut
    ms = list(range(1, 128))
    cf = kb.counterfactual_accepts(acc.numpy(), path[:, 1:].numpy(), ms)
    for m in ms:
        W = _width(m + 1)
        small = torch_ops.tree_build(dt, dlp, roots, prefix, budget=m, max_tree_nodes=W)
        _, acc_m, _ = torch_ops.tree_accept(small.tokens, small.parents, small.node_counts,
                                            ttok[:, :W].contiguous().flatten(),
                                            node_indptr=torch.arange(B + 1, dtype=torch.int32) * W)
        assert cf[:, m - 1].tolist() == acc_m.tolist(), m


def test_counterfactual_accepts_of_a_known_path():
    # request 0 accepted nodes 1, 3, 9, 20; request 1 is not decoding; request 2 accepted nothing
    acc = [4, -1, 0]
    paths = [[1, 3, 9, 20, 77, 0], [1, 2, 3, 4, 5, 6], [2, 5, 0, 0, 0, 0]]
    cf = kb.counterfactual_accepts(acc, paths, (1, 2, 4, 8, 16, 32))
    assert cf.tolist() == [[1, 1, 2, 2, 3, 4], [0] * 6, [0] * 6]


def test_auto_budget_records_paths_and_tracks_the_end():
    costs = _cost_table(3, SIX, (1.0, 1.0, 1.1, 1.3, 1.8, 3.0))
    auto = kb.AutoBudget(SIX, costs, "cpu", depth=4)
    auto.reset(3, max_new=6)
    assert auto.plan() == 32  # nothing observed yet: the middle budget
    path = torch.tensor([[0, 1, 5, 17, 40, -1], [0, 2, -1, -1, -1, -1], [0, 1, 2, 3, 4, 9]], dtype=torch.int32)
    auto.record(torch.tensor([4, -1, 2], dtype=torch.int32), path)
    assert auto.stats.tolist() == [[4, 1, 5, 17, 40], [-1, 2, -1, -1, -1], [2, 1, 2, 3, 4]]
    assert auto.observe(auto.stats, 64) is False and auto.gen.tolist() == [5, 0, 3]
    pol = auto.policy
    # observed budgets 4..64 (the round's 64): request 0 -> 1, 2, 2, 3, 4; request 2 -> 2 everywhere
    assert pol.C.tolist() == [2, 2, 2, 2, 2, 0] and pol.S.tolist() == [3, 4, 4, 5, 6, 0]
    auto.record(torch.tensor([0, 3, 0], dtype=torch.int32), path)
    assert auto.observe(auto.stats.numpy(), 4) is False and auto.gen.tolist() == [6, 4, 4]
    auto.record(torch.tensor([-1, 1, 2], dtype=torch.int32), path)
    assert auto.observe(auto.stats, 4) is True
    auto.initialise(auto.stats, 127)  # statistics only
    assert auto.gen.tolist() == [6, 6, 7]


def test_auto_budget_record_takes_counts_written_in_place():
    """A round that writes its accepted counts into auto.accepted (the engine's torch.where(..., out=)) leaves
    record only the path to copy; counts from elsewhere are still copied."""
    costs = _cost_table(2, (4, 8), (1.0, 1.1))
    auto = kb.AutoBudget((4, 8), costs, "cpu", depth=3)
    auto.reset(2, max_new=6)
    col = auto.accepted
    assert col.data_ptr() == auto.stats.data_ptr() and col.shape == (2,)
    path = torch.tensor([[0, 2, 5, 7], [0, 1, -1, -1]], dtype=torch.int32)
    torch.where(torch.tensor([True, False]), torch.tensor([3, 2], dtype=torch.int32),
                torch.full((), -1, dtype=torch.int32), out=auto.accepted)
    auto.record(auto.accepted, path)
    assert auto.stats.tolist() == [[3, 2, 5, 7], [-1, 1, -1, -1]]
    auto.record(torch.tensor([1, 0], dtype=torch.int32), path)
    assert auto.stats[:, 0].tolist() == [1, 0]


class _Sim:
    """Synthetic rounds: each request's accepted path at an unbounded budget is a chain of node indices, the
    d-th at index idx[d-1] + 1 when the target takes the drafter's next best guess (probability `top`), else
    + 1 + a geometric jump of mean `spread` (the target's token further down the best-first order), while the
    target keeps agreeing (probability `agree` per depth); a round at budget n accepts the chain's nodes of
    index <= n (what a best-first tree of n nodes holds). Drafter probabilities play no part."""

    def __init__(self, agree, spread, top=0.85, depth=16, seed=0):
        self.agree, self.spread = np.asarray(agree, float), np.asarray(spread, float)
        self.top = top
        self.depth = depth
        self.rng = np.random.default_rng(seed)

    def paths(self):
        B = len(self.agree)
        far = self.rng.geometric(1.0 / self.spread[:, None], size=(B, self.depth))
        jumps = np.where(self.rng.random((B, self.depth)) < self.top, 1, 1 + far)
        idx = np.cumsum(jumps, 1)
        keep = np.cumprod(self.rng.random((B, self.depth)) < self.agree[:, None], 1).astype(bool)
        acc_inf = keep.sum(1)
        return acc_inf, idx

    def round(self, n):
        acc_inf, idx = self.paths()
        acc = ((idx <= n) & (np.arange(self.depth)[None, :] < acc_inf[:, None])).sum(1)
        return acc, idx

    def mean_tokens(self, budgets, rounds=4000):
        tot = np.zeros(len(budgets))
        for _ in range(rounds):
            acc_inf, idx = self.paths()
            tot += kb.counterfactual_accepts(acc_inf, idx, budgets).mean(0)
        return 1 + tot / rounds


def _run(sim, budgets, costs, B, max_new, budget):
    """Decode a static batch to max_new tokens per request; budget "auto" (an AutoBudget read 2 rounds late)
    or a fixed one. Returns (time, budgets used)."""
    auto = None
    if budget == "auto":
        auto = kb.AutoBudget(budgets, costs, "cpu", depth=sim.depth)
        auto.reset(B, max_new)
        acc_inf, idx = sim.paths()  # the calibration round at the largest budget
        auto.initialise(np.concatenate([acc_inf[:, None], idx], 1), budgets[-1])
    gen = np.zeros(B, int)
    t, used, pending = 0.0, [], []
    while (gen < max_new).any():
        n = auto.plan() if auto else budget
        acc, idx = sim.round(n)
        acc = np.where(gen < max_new, acc, -1)
        gen += np.where(acc >= 0, acc + 1, 0)
        t += costs.get(B, n)
        used.append(n)
        pending.append((np.concatenate([acc[:, None], idx], 1), n))
        if auto and len(pending) > 2:
            auto.observe(*pending.pop(0))
    return t, used


# H200 step times (ms) by budget (SIX) at batch 1, 4, 16, 64 (scripts/device_auto_budget.sh, the calibration rows)
H200_COSTS = {1: (0.8423, 0.8846, 0.8846, 0.8922, 0.9798, 1.0766), 4: (0.8843, 0.9045, 0.962, 1.027, 1.2235, 1.3628),
              16: (0.9978, 1.0855, 1.1164, 1.357, 1.8684, 2.9298), 64: (1.2085, 1.479, 1.9652, 2.8403, 4.9256, 9.297)}


@pytest.mark.parametrize("B", [1, 4, 16, 64])
def test_auto_reaches_the_best_fixed_budget_on_synthetic_acceptance(B):
    """Requests that differ in how well the drafter agrees (some slow, some fast): auto, told nothing but the
    cost row, finishes the batch within 1% of the best fixed budget's time, over a few batches (the batch's
    statistics carried over, as the DDTree example's engine keeps them per batch size)."""
    budgets = SIX
    costs = _cost_table(B, budgets, H200_COSTS[B])
    rng = np.random.default_rng(B)
    batches = 8 if B == 1 else 3
    spec = [(rng.uniform(0.65, 0.9, B), rng.uniform(3.0, 15.0, B)) for _ in range(batches)]
    fixed = {}
    for n in budgets:
        fixed[n] = sum(_run(_Sim(a, s, seed=100 + i), budgets, costs, B, 128, n)[0] for i, (a, s) in enumerate(spec))
    best = min(fixed, key=fixed.get)
    auto_t = 0.0
    for i, (a, s) in enumerate(spec):
        auto_t += _run(_Sim(a, s, seed=100 + i), budgets, costs, B, 128, "auto")[0]
    assert fixed[best] / auto_t >= 0.99, (fixed, auto_t)


def test_policy_learns_what_the_drafter_probabilities_cannot_tell():
    """Observed counts only (no drafter probabilities): accepted tokens that stop growing past 8 nodes (a
    drafter whose probabilities would promise gains from every larger tree) -> 8; then a batch whose paths run
    deep into the best-first order -> the largest budget worth its cost."""
    budgets = (4, 8, 16, 32)
    pol = _policy(1, budgets, (1.0, 1.05, 1.1, 1.2))
    for _ in range(40):  # rounds at 32: 2 tokens at 4, 3 at 8 and above
        pol.add([[2, 3, 3, 3]], [True], 32)
    assert pol.best(1) == 8
    pol = _policy(1, budgets, (1.0, 1.05, 1.1, 1.2))
    for _ in range(40):
        pol.add([[1, 2, 4, 7]], [True], 32)
    assert pol.best(1) == 32


def test_policy_tries_a_larger_budget_only_when_it_could_pay():
    budgets = (4, 8, 16, 32)
    pol = _policy(1, budgets, (1.0, 1.1, 1.2, 2.0))
    for _ in range(30):  # only 4 and 8 observed; 8 gains 1 token over 4 -> 16 may gain as much: try it
        pol.add([[1, 2, 2, 2]], [True], 8)
    assert pol.best(1) == 16
    for _ in range(30):  # 16 measured: no gain over 8 -> back to 8; 32 (twice the cost) is never worth trying
        pol.add([[1, 2, 2, 2]], [True], 16)
    assert pol.best(1) == 8


def test_policy_keeps_what_no_round_observes():
    """A budget measured once and then never run keeps its measured gain: its sums decay only with new
    observations of it (a per-round decay faded them back to the optimistic bound, and auto re-tried the larger
    tree every few dozen rounds). A round that observes a budget through a quarter of the batch forgets a
    quarter of a round's worth."""
    budgets = (4, 8)
    pol = _policy(4, budgets, (1.0, 1.2))
    for _ in range(10):  # rounds at 8: 1 token at 4, the same at 8
        pol.add([[1, 1]] * 4, [True] * 4, 8)
    assert pol.best(4) == 4
    c8 = pol.C[1]
    for _ in range(300):
        pol.add([[1, 1]] * 4, [True] * 4, 4)
        assert pol.best(4) == 4
    assert pol.C[1] == c8 and pol.estimates()[1] - pol.estimates()[0] < 0.2
    c4 = pol.C[0]
    pol.add([[1, 1]] * 4, [True, False, False, False], 4)
    assert pol.C[0] == pytest.approx(c4 * pol.decay ** 0.25 + 1)


def test_policy_scales_a_slow_requests_unmeasured_gain():
    """The batch gains 1 token from 8 over 4 (measured by an earlier batch); a new batch's slow request accepts
    nothing at 4 and has not run 8 yet. Its gain is taken in proportion to its own rate at 4, not as the batch's
    whole token: the batch's finishing time (the slow request's) is shortest at 4 when 8 costs 1.5x."""
    budgets = (4, 8)
    pol = _policy(2, budgets, (1.0, 1.5))
    for _ in range(20):
        pol.add([[2, 3], [2, 3]], [True, True], 8)
    pol.requests(2)
    for _ in range(20):
        pol.add([[3, 3], [0, 0]], [True, True], 4)
    pol.choice = None
    assert pol.best(2, remaining=[100, 100]) == 4
    # unscaled, the slow request would be credited the batch's token: 1 + a(8) = 2.3 against 1.3 -> 8
    a = pol.estimates()
    slow_unscaled = (pol.rS[1, 0] + pol.shrink * a[0]) / (pol.rC[1, 0] + pol.shrink) + (a[1] - a[0])
    slow_4 = (pol.rS[1, 0] + pol.shrink * a[0]) / (pol.rC[1, 0] + pol.shrink)
    assert 1.5 / (1 + slow_unscaled) < 1.0 / (1 + slow_4)


def test_policy_minimises_the_batchs_finishing_time():
    """Two requests: a fast one that gains from a larger tree and a slow one that does not. The mean rate
    prefers 8, but the batch ends with the slow request, which prefers 4."""
    budgets = (4, 8)
    pol = _policy(2, budgets, (1.0, 1.2))
    for _ in range(60):
        pol.add([[3, 6], [1, 1]], [True, True], 8)
    # the mean rate: (1 + 2) / 1.0 = 3.0 at 4, (1 + 3.5) / 1.2 = 3.75 at 8; the slow request: 2 / 1.0 at 4, 2 / 1.2 at 8
    assert pol.best(2) == 8
    pol.choice = None
    assert pol.best(2, remaining=[100, 100]) == 4
    # the slow request is done: the fast one's rate decides
    pol.choice = None
    assert pol.best(2, remaining=[100, 0]) == 8


def test_policy_counts_a_requests_last_round():
    """A request with r tokens left needs about r / (1 + a) + LAST_ROUND rounds (its last round overshoots the
    end): with 2 and 3 tokens a round at budgets costing 1.0 and 1.3, the larger tree's rate wins far from the
    end (100 / 3 * 1.3 < 100 / 2), and the cheaper round near it (2 / 2 + 1/2 < (2 / 3 + 1/2) * 1.3), where
    the rates alone would still choose the larger tree."""
    assert kb.LAST_ROUND == 0.5
    budgets = (4, 8)
    pol = _policy(1, budgets, (1.0, 1.3))
    for _ in range(200):
        pol.add([[1, 2]], [True], 8)
    a = pol.estimates()
    assert a == pytest.approx([1.0, 2.0], abs=0.02)
    assert pol.best(1, remaining=[100]) == 8
    pol.choice = None
    assert pol.best(1, remaining=[2]) == 4
    t = pol.times(1, remaining=[2])
    assert t[0] < t[1] and 1.3 / (1 + a[1]) < 1.0 / (1 + a[0])


def test_cost_table_is_made_non_decreasing():
    t = kb.CostTable()
    times = {4: [1.0, 1.1, 0.7], 8: [1.3], 16: [1.2], 32: [1.1], 64: [2.0]}
    t.measure(1, list(times), lambda b: times[b])
    # 4: the median of its three; 8 and 16 read the least median above them, 32's
    assert [t.get(1, b) for b in (4, 8, 16, 32, 64)] == [1.0, 1.1, 1.1, 1.1, 2.0]
    assert t.row_of(1, (64, 8)) == [2.0, 1.1] and t.row(1) == {4: 1.0, 8: 1.1, 16: 1.1, 32: 1.1, 64: 2.0}
    with pytest.raises(ValueError, match="budget 8"):
        t.measure(2, [4, 8], lambda b: [] if b == 8 else [1.0])


def test_cost_table_follows_the_latest_samples_and_reads_non_decreasing():
    t = kb.CostTable(window=4)
    t.measure(1, (4, 8, 16), lambda b: {4: [1.0] * 3, 8: [1.2] * 3, 16: [1.4] * 3}[b])
    t.observe(1, 8, 2.2)  # one slow round among four samples: the median moves half way
    assert abs(t.get(1, 8) - 1.2) < 1e-12
    t.observe(1, 8, 2.2)  # 8's median 1.7 reads as 16's 1.4: a smaller tree never costs more
    assert t.get(1, 8) == 1.4 and t.get(1, 16) == 1.4
    for _ in range(2):
        t.observe(1, 8, 2.2)  # the calibration's samples have left the window: 8's median is 2.2
    assert t.row(1) == {4: 1.0, 8: 1.4, 16: 1.4}
    t.observe(1, 16, 2.6)
    t.observe(1, 16, 2.6)  # 16's own rounds raise its median (2.0), and 8's reading with it
    assert t.row(1) == {4: 1.0, 8: 2.0, 16: 2.0}
    t.observe(1, 16, 2.6)  # 16's median 2.6: 8 reads its own
    assert t.row(1) == {4: 1.0, 8: 2.2, 16: 2.6}
    for _ in range(4):  # the samples are kept as measured, the rule only on reading
        t.observe(1, 8, 1.0)
    assert t.row(1) == {4: 1.0, 8: 1.0, 16: 2.6}
    t.observe(1, 32, 9.0)  # a budget the table lacks is ignored
    assert 32 not in t.row(1)
    t.observe(2, 4, 9.0)  # as is another batch size
    assert t.row(2) == {}
    with pytest.raises(KeyError, match="budget 32 at batch 1"):
        t.get(1, 32)


def test_cost_table_a_stale_dear_median_does_not_raise_the_larger_budgets():
    """The H100 failure (examples/ddtree/README.md, training 1, batch 1): budget 31's loop rounds read 1.48 ms
    where it costs 1.28, and the loop, off 31, never replaced them. Read as the largest median below, 63 read
    1.48 for its 1.36 and the policy chose 15 over 63; read from above, 31 reads 63's 1.36 and 63 is chosen."""
    budgets = (15, 31, 63)
    t = kb.CostTable()
    t.measure(1, budgets, lambda b: {15: [1.25e-3] * 6, 31: [1.28e-3] * 6, 63: [1.36e-3] * 6}[b])
    for _ in range(16):
        t.observe(1, 31, 1.48e-3)  # 31's window: inflated rounds only
    for _ in range(20):
        t.observe(1, 63, 1.36e-3)
        t.observe(1, 15, 1.25e-3)
    assert t.row(1) == {15: 1.25e-3, 31: 1.36e-3, 63: 1.36e-3}
    pol = kb.BudgetPolicy(budgets, t)
    pol.requests(1)
    for _ in range(40):  # 15 accepts 2 draft tokens a round; 31 one more on 1 round in 6, 63 on 2
        for c in [[2, 2, 2]] * 4 + [[2, 3, 3], [2, 2, 3]]:
            pol.add([c], [True], 63)
    a = pol.estimates()
    assert a == pytest.approx([2.0, 2.31, 2.49], abs=0.01)
    assert pol.best(1) == 63  # 3.49 / 1.36 against 3.0 / 1.25
    assert int(np.argmin(pol.times(1, cost=[1.25e-3, 1.48e-3, 1.48e-3]))) == 0  # the old reading: 15


class _Pipe:
    """A host issuing rounds to a device on one stream, on a deterministic clock (seconds). A round at budget b
    takes the host host_s[b] to issue (eager: Python and launches) and the device dev_s[b] to run; the device
    starts as the host issues and ends `tail` after the last launch at the earliest (the last kernels run after
    it). So a round timed alone and synchronised costs host_s + tail where the host is the bottleneck, while
    rounds back to back cost max(host_s, dev_s) each. `event()` makes events on this clock (the device's time
    when the work before them is done); synchronising one moves the host's clock to it."""

    def __init__(self, host_s, dev_s, tail):
        self.host_s, self.dev_s, self.tail = host_s, dev_s, tail
        self.host = self.dev = 0.0

    def round(self, b):
        start = max(self.dev, self.host)
        self.host += self.host_s[b]
        self.dev = max(start + self.dev_s[b], self.host + self.tail)

    def work(self, seconds):
        self.host += seconds

    def sync(self):
        self.host = max(self.host, self.dev)

    def event(self):
        pipe = self

        class Event:
            t = None

            def record(self):
                self.t = pipe.dev

            def synchronize(self):
                pipe.host = max(pipe.host, self.t)

            def elapsed_time(self, end):
                return 1e3 * (end.t - self.t)

        return Event()


def test_round_log_reads_lag_rounds_late_with_each_rounds_time():
    pipe = _Pipe({4: 0.002, 64: 0.001}, {4: 0.001, 64: 0.005}, tail=0.0005)
    stats = torch.zeros(2, 3, dtype=torch.int32)
    log = kb.RoundLog(stats, 2, event=pipe.event)
    got = []
    for r, b in enumerate((4, 4, 64, 64, 64, 4)):
        pipe.round(b)
        stats.fill_(r)
        log.push(stats, b)
        assert log.pending() <= 3
        if log.ready():
            got.append(log.pop())
    while log.pending():
        got.append(log.pop())
    assert [g[0][0, 0] for g in got] == list(range(6)) and [g[1] for g in got] == [4, 4, 64, 64, 64, 4]
    secs = [g[2] for g in got]
    # round 0: no previous round; 4 host-bound (2 ms), 64 device-bound (5 ms): each round's own time
    assert secs[0] is None and secs[1] == pytest.approx(0.002)
    assert secs[2:5] == pytest.approx([0.005] * 3)
    assert secs[5] == pytest.approx(0.001)  # the device ran round 5 as soon as round 4 ended: its device time
    with pytest.raises(RuntimeError, match="no round"):
        log.pop()
    for _ in range(3):
        log.push(stats)
    with pytest.raises(RuntimeError, match="pop before pushing"):  # a fourth would overwrite an unread row
        log.push(stats)


def test_steady_round_seconds_times_rounds_as_the_loop_runs_them():
    """Eager rounds on a host-bound budget: synchronised alone one costs host + tail; back to back, with the
    loop's lagged reads and host work, each costs what the loop's rounds do."""
    pipe = _Pipe({31: 0.006, 127: 0.006}, {31: 0.002, 127: 0.010}, tail=0.004)
    t0 = pipe.host
    pipe.round(31)
    pipe.sync()
    assert pipe.host - t0 == pytest.approx(0.010)  # what a synchronised calibration measured
    stats = torch.zeros(1, 4, dtype=torch.int32)
    seen = []
    secs, rows = kb.steady_round_seconds(lambda: pipe.round(31), stats, 5, lag=2,
                                         host_work=lambda row: (seen.append(row), pipe.work(0.0005)), event=pipe.event)
    assert len(secs) == 5 and len(rows) == 8 == len(seen)  # 2 + 1 rounds fill the pipeline
    assert secs == pytest.approx([0.0065] * 5)  # the host's issue time and its work on a row
    secs, _ = kb.steady_round_seconds(lambda: pipe.round(127), stats, 3, lag=2, event=pipe.event)
    assert secs == pytest.approx([0.010] * 3)  # device-bound
    with pytest.raises(ValueError, match="rounds"):
        kb.steady_round_seconds(lambda: None, stats, 0)


def test_auto_calibration_measures_steady_rounds_and_gives_first_counts():
    """AutoBudget.calibrate on the pipe: every budget's row is its steady round time (max of host and device),
    not a synchronised round's (which made budget 31 look as dear as 127 on the H200's eager transformers
    path); the state is restored after every burst, and the largest budget's rounds give every budget's counts."""
    budgets = (4, 31, 127)
    pipe = _Pipe({4: 0.006, 31: 0.006, 127: 0.006}, {4: 0.001, 31: 0.003, 127: 0.012}, tail=0.005)
    costs = kb.CostTable()
    auto = kb.AutoBudget(budgets, costs, "cpu", depth=3)
    auto.reset(2, max_new=64)
    restores = []
    runs = []

    def run_round(b):
        pipe.round(b)
        runs.append(b)
        # request 0 accepts nodes 2, 9, 40 (3 tokens at 127, 2 at 31, 1 at 4); request 1 node 1 only
        auto.record(torch.tensor([{4: 1, 31: 2, 127: 3}[b], 1], dtype=torch.int32),
                    torch.tensor([[0, 2, 9, 40], [0, 1, -1, -1]], dtype=torch.int32))

    auto.calibrate(run_round, lambda: restores.append(len(runs)), rounds=4, lag=2, event=pipe.event)
    # a warm round per budget, one round at 127, then 4 + 2 + 1 rounds per budget (2 + 1 fill the pipeline);
    # restored after each
    assert runs == [4, 31, 127, 127] + [4] * 7 + [31] * 7 + [127] * 7 and restores == [1, 2, 3, 4, 11, 18, 25]
    assert costs.row(2) == pytest.approx({4: 0.006, 31: 0.006, 127: 0.012})
    pol = auto.policy
    # counts: the first round and the 127 burst's 6 later rounds, 2 requests each, every budget observed;
    # request 0 accepts 1, 2, 3 tokens at 4, 31, 127 (nodes 2, 9, 40), request 1 one (node 1)
    w = sum(0.98 ** k for k in range(7))
    assert pol.C == pytest.approx([2 * w] * 3) and pol.S == pytest.approx([2 * w, 3 * w, 4 * w])
    assert pol.rC[:, 0].tolist() == [7, 7] and pol.rS[0].tolist() == [7, 14, 21]
    assert auto.gen.tolist() == [0, 0]  # statistics only


def test_auto_cost_table_follows_the_decoding_loops_rounds():
    """A decoding loop as the engine's (plan, round, push, lagged read with the round's time): the table
    follows the real rounds: here budget 16's steady round costs twice what its calibration said (the KV grew),
    and auto leaves it for 8."""
    budgets = (8, 16)
    pipe = _Pipe({8: 0.001, 16: 0.001}, {8: 0.004, 16: 0.005}, tail=0.0)
    costs = kb.CostTable(window=8)
    auto = kb.AutoBudget(budgets, costs, "cpu", depth=2)
    auto.reset(1, max_new=10 ** 6)

    def run_round(b):
        pipe.round(b)
        acc = 2 if b == 16 else 1  # 16 accepts one token more than 8: 3 / 5 ms against 2 / 4 ms
        auto.record(torch.tensor([acc], dtype=torch.int32), torch.tensor([[0, 5, 12]], dtype=torch.int32))

    auto.calibrate(run_round, lambda: None, rounds=3, lag=2, event=pipe.event)
    assert costs.row(1) == pytest.approx({8: 0.004, 16: 0.005})
    pipe.dev_s[16] = 0.010  # now 3 / 10 ms: 8 is better
    log = kb.RoundLog(auto.stats, 2, event=pipe.event)
    used = []
    for _ in range(40):
        b = auto.plan()
        used.append(b)
        run_round(b)
        log.push(auto.stats, b)
        if log.ready():
            row, ran, secs = log.pop()
            auto.observe(row, ran, seconds=secs)
    assert used[0] == 16 and 8 in used and used[-20:] == [8] * 20
    assert costs.get(1, 16) > 0.0075 and costs.get(1, 8) == pytest.approx(0.004)
