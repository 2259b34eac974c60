"""A per-round DDTree tree budget chosen from cost (the CaDDTree idea), shared by the transformers
integration and the DDTree example (examples/ddtree/engine.py).

The budget maximises the decoding rate: tokens per request and round, 1 + a(n), over the round's measured
time cost(B, n) at this batch size (`CostTable`, measured once per batch size, so nobody has to say the batch).
a(n), the accepted draft tokens at budget n, is measured, not predicted: tree_build pops nodes in one
deterministic order whatever the budget (the budget only stops the loop), so the budget-m tree is the first
m + 1 nodes of any larger one (`prefix_tree`), and tree_accept walks the same target tokens in both. A round
verified at budget n therefore tells exactly what every budget m <= n would have accepted: the accepted
path's nodes with index <= m (indices grow along a path). Every round records its accepted path; the host
turns it into counterfactual accepted counts of every candidate budget up to the round's own (`AcceptStats`),
for the batch (recency-weighted) and per request. Larger budgets than those run lately are estimated
optimistically (a doubling gains at most what the previous doubling gained: acceptance is concave in the log
of the budget), which is what makes the policy try a larger tree, and only when that could pay.

The objective is the batch's finishing time, not the mean rate: a static batch runs until its slowest request
is done, so the policy minimises cost(n) x max over requests of (tokens left / (1 + a_b(n))), with each
request's a_b shrunk towards the batch's (`BudgetPolicy`). With one request, or early, that is the mean rate.

`AutoBudget` runs it without a host synchronisation in a round: the round writes its accepted counts and paths
into one small device buffer at a fixed address (so a round can be a CUDA graph); the host copies it with the
round and reads it `lag` rounds late (it also tells the host when every request is done: the host follows
each request's generated count). The tree is built at the round's own budget: no probe rounds.
"""
from __future__ import annotations

import statistics
import time

import numpy as np
import torch

# The fixed budgets the DDTree example measures; auto chooses among the same trees each round.
DEFAULT_BUDGETS = (4, 8, 16, 32, 64, 127)


def prefix_tree(tree, budget: int, max_tree_nodes: int):
    """The tree tree_build would build at `budget` and width `max_tree_nodes`, cut out of a tree it built at a
    larger budget (and width): the first min(node count, budget + 1) nodes, padded like tree_build pads (ids
    -1, mask words 0, scores -inf), links to nodes past the cut set to -1, mask words beyond ceil(W/64)
    dropped (a node's mask bits are itself and its ancestors, all of a smaller index). Every output is a new
    contiguous tensor of tree_build's dtype; no host synchronisation (safe inside CUDA-graph capture).
    `tree` is a TreeBuildResult of either backend; returns the same type."""
    W, N = int(max_tree_nodes), int(budget) + 1
    big = tree.tokens.shape[1]
    if not 1 <= budget or N > W or W > big:
        raise ValueError(f"prefix_tree: need budget + 1 <= max_tree_nodes <= the tree's width {big}, "
                         f"got budget {budget}, max_tree_nodes {W}")
    mw = (W + 63) // 64
    counts = tree.node_counts.clamp(max=N)
    col = torch.arange(W, dtype=counts.dtype, device=counts.device)
    keep = col[None, :] < counts[:, None]  # [B, W]

    def ids(x):
        return torch.where(keep, x[:, :W], -1)

    def link(x):
        x = x[:, :W]
        return torch.where(keep & (x < counts[:, None]), x, -1)

    return type(tree)(
        ids(tree.tokens), ids(tree.parents), ids(tree.depths), ids(tree.positions),
        torch.where(keep[:, :, None], tree.tree_mask[:, :W, :mw], 0),
        link(tree.first_child), link(tree.next_sibling), counts.contiguous(),
        torch.where(keep, tree.scores[:, :W], float("-inf")))


class CostTable:
    """Measured seconds of one decoding step by (batch size, budget)."""

    def __init__(self):
        self._t = {}

    def has(self, batch: int, budgets) -> bool:
        return all((batch, b) in self._t for b in budgets)

    def set(self, batch: int, budget: int, seconds: float):
        self._t[(batch, budget)] = float(seconds)

    def get(self, batch: int, budget: int) -> float:
        return self._t[(batch, budget)]

    def row(self, batch: int):
        return {b: s for (B, b), s in sorted(self._t.items()) if B == batch}

    def measure(self, batch: int, budgets, run_step, *, repeats=5, sync=None):
        """run_step(budget) runs one step (state restored by the caller) and returns its seconds, or None to
        be timed here by the wall clock (with `sync` after it). The median of `repeats` after a warm-up is
        stored for each budget; then the row is made non-decreasing in the budget (a larger tree never costs
        less; this keeps the timer's noise from favouring a larger tree)."""
        budgets = sorted(budgets)
        for b in budgets:
            run_step(b)
            if sync:
                sync()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                got = run_step(b)
                if sync:
                    sync()
                times.append(got if got is not None else time.perf_counter() - t)
            self.set(batch, b, statistics.median(times))
        self._monotone(batch)

    def observe(self, batch: int, budget: int, seconds: float, *, weight: float = 0.2):
        """Folds a step's time seen while decoding into the row (an exponential average), then keeps the row
        non-decreasing: a one-off measurement can misjudge the steady cost (eager steps, whose launches overlap
        the device's work only in a running loop)."""
        if (batch, budget) not in self._t:
            return
        self.set(batch, budget, (1 - weight) * self.get(batch, budget) + weight * float(seconds))
        self._monotone(batch)

    def _monotone(self, batch: int):
        top = 0.0
        for b, s in self.row(batch).items():
            top = max(top, s)
            self.set(batch, b, top)


def counterfactual_accepts(accepted, paths, budgets) -> np.ndarray:
    """What each budget would have accepted in a round, from the path the round accepted: accepted [B] the
    round's accepted draft tokens per request (-1: the request was not decoding), paths [B, L] the accepted
    path's node indices after the root (path[:, 1:] of tree_accept; entries past `accepted` are ignored) ->
    [B, len(budgets)] int: the budget-m tree is the first m + 1 nodes of the round's tree, so budget m accepts
    the path's nodes of index <= m (a prefix of the path: indices grow along it). Exact for every m up to the
    round's own budget; larger ones read as the round's own count."""
    acc = np.asarray(accepted).reshape(-1)
    p = np.asarray(paths).reshape(acc.shape[0], -1)
    valid = np.arange(p.shape[1])[None, :] < acc[:, None]
    bud = np.asarray(budgets)
    return ((p[:, :, None] <= bud[None, None, :]) & valid[:, :, None]).sum(1)


class BudgetPolicy:
    """Chooses the budget among `budgets` from counterfactual accepted counts and the cost table.

    Statistics, per candidate budget k (observations: one per decoding request and round whose budget was at
    least budgets[k]): S[k] the accepted draft tokens at budgets[k], P[k] those at budgets[k-1] in the same
    observations, C[k] their number. a(budgets[0]) = S[0] / C[0] and each step up adds its paired increment
    (S[k] - P[k]) / C[k], whose variance is far smaller than that of two separate means. The batch's sums
    decay by `decay` per round (the requests still decoding matter, and a new prompt's text); each request's
    own sums do not, and its estimate is shrunk towards the batch's with `shrink` pseudo-observations.

    An increment with few observations is pulled towards an optimistic bound, the previous increment (a
    doubling of the tree gains at most what the previous doubling gained; the first step at most a(budgets[0]))
    with `prior` pseudo-observations: a larger budget is tried when its bound could beat the current choice,
    and stops being tried once measured. `hysteresis`: the relative gain needed to leave the current budget."""

    def __init__(self, budgets=DEFAULT_BUDGETS, costs: CostTable | None = None, *, decay=0.98, prior=4.0,
                 shrink=4.0, hysteresis=0.01):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs if costs is not None else CostTable()
        self.decay, self.prior, self.shrink, self.hysteresis = float(decay), float(prior), float(shrink), hysteresis
        K = len(self.budgets)
        self._bud = np.asarray(self.budgets)
        self.S, self.P, self.C = np.zeros(K), np.zeros(K), np.zeros(K)
        self.requests(1)
        self.choice = None
        self.history = []  # chosen budgets, for reports

    def requests(self, batch: int):
        """New requests in the batch's slots: their own statistics start empty (the batch's stay)."""
        K = len(self.budgets)
        self.rS, self.rP, self.rC = np.zeros((batch, K)), np.zeros((batch, K)), np.zeros((batch, K))

    def add(self, counts, active, used: int):
        """One round's numbers: counts [B, K] from counterfactual_accepts, active [B] bool (the requests the
        round decoded), used: the round's budget (only budgets <= used are observed)."""
        counts = np.asarray(counts, dtype=np.float64)
        obs = (np.asarray(active, dtype=bool)[:, None] & (self._bud[None, :] <= used)).astype(np.float64)
        lower = np.concatenate([np.zeros((counts.shape[0], 1)), counts[:, :-1]], 1)
        for tot, x in ((self.S, counts), (self.P, lower), (self.C, 1.0)):
            tot *= self.decay
            tot += (x * obs).sum(0)
        self.rS += counts * obs
        self.rP += lower * obs
        self.rC += obs

    def _chain(self, S, P, C, prior_base=None, prior_inc=None, w=0.0):
        """a(budgets[k]) for every k, from sums S, P, C ([..., K]); prior_inc (the batch's increments) with weight
        w, else the optimistic bound with weight self.prior."""
        K = len(self.budgets)
        if prior_base is None:
            base = S[..., 0] / np.maximum(C[..., 0], 1e-9)
        else:
            base = (S[..., 0] + w * prior_base) / (C[..., 0] + w)
        a = [base]
        for k in range(1, K):
            if prior_inc is None:
                bound = a[0] if k == 1 else a[k - 1] - a[k - 2]
                wk = self.prior
            else:
                bound, wk = prior_inc[k - 1], w
            inc = (S[..., k] - P[..., k] + wk * bound) / (C[..., k] + wk)
            a.append(a[k - 1] + np.maximum(inc, 0.0))
        return np.stack(a, -1)

    def estimates(self):
        """The batch's accepted draft tokens per round by budget ([K]), or None before any observation."""
        if self.C[0] <= 0:
            return None
        return self._chain(self.S, self.P, self.C)

    def times(self, batch: int, remaining=None):
        """Predicted time to finish the batch at each budget ([K], relative), or None before any observation:
        cost(batch, n) x max over the requests still decoding of remaining_b / (1 + a_b(n)). remaining [B]
        tokens left per request (None or all <= 0: one request's rate)."""
        a = self.estimates()
        if a is None:
            return None
        cost = np.asarray([self.costs.get(batch, b) for b in self.budgets])
        if remaining is None or self.rC.shape[0] != len(remaining):
            return cost / (1.0 + a)
        rem = np.asarray(remaining, dtype=np.float64)
        live = rem > 0
        if not live.any():
            return cost / (1.0 + a)
        inc = np.diff(a)
        ab = self._chain(self.rS[live], self.rP[live], self.rC[live], prior_base=a[0], prior_inc=inc, w=self.shrink)
        return cost * (rem[live, None] / (1.0 + ab)).max(0)

    def best(self, batch: int, remaining=None):
        """The budget of the rounds to come (None before any observation)."""
        t = self.times(batch, remaining)
        if t is None:
            return None
        k = int(np.argmin(t))
        if self.choice in self.budgets:
            cur = self.budgets.index(self.choice)
            if t[k] > t[cur] * (1.0 - self.hysteresis):
                k = cur
        self.choice = self.budgets[k]
        return self.choice


class AutoBudget:
    """budget "auto" for a decoding loop, with no host synchronisation inside a round.

    Per round the loop asks `plan()` for the budget and builds that tree; at the round's end `record` writes
    the round's accepted counts and paths into `self.stats` (int32 [B, 1 + depth], at a fixed address, so the
    round can be a CUDA graph): column 0 the accepted draft tokens (-1: the request was not decoding), columns
    1.. the accepted path's node indices after the root. The loop copies `stats` to the host with the round and
    hands the copy to `observe` when it has arrived (`lag` rounds later); it returns whether every request is
    done (the host adds each request's accepted + 1 to its generated count, as the round did on the device).
    """

    def __init__(self, budgets, costs: CostTable, device, *, depth: int, policy=None):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs
        self.device = torch.device(device)
        self.depth = int(depth)
        self.policy = policy if policy is not None else BudgetPolicy(self.budgets, costs)
        self.batch, self.max_new = None, None
        self.stats = None
        self.gen = None

    def reset(self, batch: int, max_new: int):
        """A new batch (admission): each request's statistics restart; the batch's are kept while the batch size
        is unchanged (its cost row is the same)."""
        if self.batch != batch:
            self.policy = BudgetPolicy(self.budgets, self.costs)
            self.stats = torch.zeros(batch, 1 + self.depth, dtype=torch.int32, device=self.device)
        self.policy.requests(batch)
        self.batch, self.max_new = batch, int(max_new)
        self.gen = np.zeros(batch, dtype=np.int64)

    def plan(self) -> int:
        """The budget of the next round."""
        b = self.policy.best(self.batch, self.max_new - self.gen)
        if b is None:
            b = self.budgets[len(self.budgets) // 2]
        self.policy.history.append(b)
        return b

    def record(self, accepted, path):
        """The round's numbers into self.stats (on the device, two copies). accepted [B]: the accepted draft
        tokens of the requests the round decoded, -1 for the others; path [B, W]: tree_accept's path."""
        L = min(path.shape[1] - 1, self.depth)
        self.stats[:, 0].copy_(accepted)
        self.stats[:, 1:1 + L].copy_(path[:, 1:1 + L])

    def observe(self, row, used: int, advance: bool = True) -> bool:
        """A round's stats as read on the host ([B, 1 + depth], a tensor or array), `used` the budget it ran
        with. Returns whether every request was done after it. advance=False: a calibration round (its state was
        restored): statistics only."""
        row = np.asarray(row).reshape(self.batch, -1)
        acc = row[:, 0].astype(np.int64)
        active = acc >= 0
        self.policy.add(counterfactual_accepts(acc, row[:, 1:], self.budgets), active, used)
        if advance:
            self.gen[active] += acc[active] + 1
        return bool((self.gen >= self.max_new).all())

    def initialise(self, row, used: int):
        """A calibration round (state restored after), best at the largest budget: every budget's counts."""
        self.observe(row, used, advance=False)
