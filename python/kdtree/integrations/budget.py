"""A per-round DDTree tree budget chosen from cost (the CaDDTree idea), shared by the transformers
integration and the DDTree example (examples/ddtree/engine.py).

The drafter's per-depth top-K log-probs give, through tree_build's best-first scores, the cumulative path
probability of every node the tree would hold. A best-first tree of budget n holds the n highest-scoring
nodes, and the target accepts a node exactly when its whole path is the target's path, so with a calibrated
drafter the expected accepted tokens of request b are E_b(n) = sum of exp(score) over the first n nodes of
the largest tree. tree_build pops nodes in one deterministic order whatever the budget (the budget only stops
the loop), so the budget-n tree IS the first n + 1 nodes of the largest one (`prefix_tree`): one build at
the largest budget serves both the choice and the round. The budget maximises
(active requests + c * sum_b E_b(n)) / cost(B, n): tokens per second of the step, where cost(B, n) is the
step's measured time at this batch and budget (a table measured once per batch size, so nobody has to say
the batch size) and c an online correction of the drafter's calibration (accepted / predicted so far).

`AutoBudget` runs that policy without a host synchronisation per round: every `probe_every`-th round (a
"probe") builds the largest tree, cuts the round's tree out of it and writes the predictions into a small
device vector; the other rounds build their own tree directly. The host reads each round's vector when it
reads the round's "all done" flag anyway (`lag` rounds late, without waiting on the device), and the budget
of the rounds after that follows. Only the candidate budgets' shapes run (DEFAULT_BUDGETS: six trees).
"""
from __future__ import annotations

import statistics
import time

import torch

# The fixed budgets the DDTree example measures; auto chooses among the same trees each round.
DEFAULT_BUDGETS = (4, 8, 16, 32, 64, 127)
PROBE_EVERY = 8  # rounds between two probes of the largest tree (a probe: tree_build at the largest budget, the cut)


def expected_accepts(scores: torch.Tensor, budgets) -> torch.Tensor:
    """scores [B, W] float32 of a best-first tree (node 0 the root; absent nodes -inf) -> [B, len(budgets)]
    expected accepted draft tokens under the drafter's own probabilities for each budget (<= W - 1)."""
    p = torch.nan_to_num(scores[:, 1:].float().exp(), nan=0.0)
    cum = p.cumsum(1)
    idx = torch.as_tensor([b - 1 for b in budgets], device=scores.device)
    return cum.index_select(1, idx)


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
        top = 0.0
        for b in budgets:
            top = max(top, self.get(batch, b))
            self.set(batch, b, top)


class BudgetPolicy:
    """Chooses the budget among `budgets` from the drafter's predicted accepts and the cost table."""

    def __init__(self, budgets=DEFAULT_BUDGETS, costs: CostTable | None = None, *, calibrate=True, prior=20.0,
                 smoothing=0.5):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs if costs is not None else CostTable()
        self.calibrate = calibrate
        self.smoothing = smoothing
        # accepted / predicted so far, starting from `prior` rounds' worth of "calibrated" (ratio 1)
        self._acc, self._pred = prior, prior
        self._last_pred = None
        self._ema = None       # predicted accepts per budget (summed over the active requests), smoothed
        self._active = 1.0
        self.history = []  # chosen budgets, for reports

    @property
    def correction(self) -> float:
        return self._acc / self._pred if self.calibrate else 1.0

    def best(self, pred, n_active, batch) -> int:
        """argmax over the budgets of (n_active + c * pred[i]) / cost(batch, budgets[i])."""
        c, n_active = self.correction, max(float(n_active), 1.0)
        best, best_rate = self.budgets[0], -1.0
        for b, p in zip(self.budgets, pred):
            rate = (n_active + c * p) / self.costs.get(batch, b)
            if rate > best_rate:
                best, best_rate = b, rate
        return best

    def observe_probe(self, pred, n_active, accepted=None, used=None):
        """A probe round's numbers: pred[i] the predicted accepted draft tokens of budgets[i] over the active
        requests, n_active their number, and (for the calibration) `accepted`, what the round accepted with
        its budget `used`."""
        pred = [float(x) for x in pred]
        if accepted is not None and used in self.budgets and self.calibrate:
            self._acc += float(accepted)
            self._pred += pred[self.budgets.index(used)]
        a = self.smoothing
        self._ema = pred if self._ema is None else [(1 - a) * e + a * p for e, p in zip(self._ema, pred)]
        self._active = float(n_active)

    def current(self, batch) -> int | None:
        """The budget of the rounds to come, from the probes seen so far (None before the first)."""
        return None if self._ema is None else self.best(self._ema, self._active, batch)

    def choose(self, scores: torch.Tensor, active: torch.Tensor, batch: int, prev_accepted=None) -> int:
        """The budget for this round's own largest tree (one host read). prev_accepted: the previous round's
        accepted draft tokens summed over its active requests (a device scalar, read in the same transfer),
        which updates the calibration."""
        e = expected_accepts(scores, self.budgets) * active[:, None].float()  # [B, n_budgets]
        parts = [e.sum(0), active.float().sum().view(1)]
        if prev_accepted is not None:
            parts.append(prev_accepted.float().view(1))
        total = torch.cat(parts).tolist()
        if prev_accepted is not None:
            self.observe(total.pop())
        pred, n_active = total[:-1], total[-1]
        best = self.best(pred, n_active, batch)
        self._last_pred = pred[self.budgets.index(best)]
        self.history.append(best)
        return best

    def observe(self, accepted_total: float):
        """The accepted draft tokens of the round just chosen (summed over the active requests)."""
        if self._last_pred is not None:
            self._acc += accepted_total
            self._pred += self._last_pred
            self._last_pred = None


class AutoBudget:
    """budget "auto" for a decoding loop, with no host synchronisation inside a round.

    Per round the loop asks `plan()` for (budget, probe); the round builds its tree with `build_tree` (a probe
    builds the largest tree and cuts the round's out of it with `prefix_tree`), and at its end `record` writes
    the round's numbers into `self.stats` (a device vector, at a fixed address, so the round can be a CUDA
    graph). The loop copies `stats` to the host with the round's "all done" flag and hands the copy to
    `observe` when it has arrived (`lag` rounds later); the next plans follow the probes seen so far.

    stats (float32): [probe, active requests, accepted draft tokens over the active requests, all done,
    predicted accepts of each budget over the active requests]; a round that does not probe writes only the
    probe flag (0) and "all done".
    """
    HEAD = 4

    def __init__(self, budgets, costs: CostTable, device, *, probe_every=PROBE_EVERY, policy=None):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs
        self.policy = policy if policy is not None else BudgetPolicy(self.budgets, costs)
        self.probe_every = max(1, int(probe_every))
        self.stats = torch.zeros(self.HEAD + len(self.budgets), dtype=torch.float32, device=device)
        self._bidx = torch.as_tensor([b - 1 for b in self.budgets], device=device)
        self.batch = None
        self.round = 0
        self.start = None  # the budget before any probe of this batch has been read

    def reset(self, batch: int):
        """A new batch (admission): probe on the first round; keep the calibration and predictions when the
        batch size is unchanged."""
        if self.batch != batch:
            self.policy = BudgetPolicy(self.budgets, self.costs, calibrate=self.policy.calibrate)
            self.start = None
        self.batch, self.round = batch, 0

    def plan(self):
        """(budget, probe) of the next round."""
        probe = self.round % self.probe_every == 0
        self.round += 1
        b = self.policy.current(self.batch)
        if b is None:
            b = self.start if self.start is not None else self.budgets[len(self.budgets) // 2]
        return b, probe

    def build_tree(self, ops, draft_tokens, draft_logprobs, roots, prefix_lens, budget, probe, width):
        """The round's tree at `budget` (width(nodes) gives the tree width W of that many nodes), and the
        largest tree when probing (else None)."""
        if not probe:
            return ops.tree_build(draft_tokens, draft_logprobs, roots, prefix_lens, budget=budget,
                                  max_tree_nodes=width(budget + 1)), None
        bmax = self.budgets[-1]
        big = ops.tree_build(draft_tokens, draft_logprobs, roots, prefix_lens, budget=bmax,
                             max_tree_nodes=width(bmax + 1))
        if budget == bmax:
            return big, big
        return prefix_tree(big, budget, width(budget + 1)), big

    def record(self, active, accepted, done, big=None):
        """The round's numbers into self.stats (on the device). active [B] bool (the requests this round
        decoded), accepted [B] its accepted draft tokens, done: a bool scalar tensor (every request finished),
        big: the probe's largest tree (None on other rounds)."""
        if big is None:  # two small kernels: the rest of the vector is read only after a probe
            self.stats[0].zero_()
            self.stats[3].copy_(done.reshape(()))
            return
        act = active.float()
        head = torch.stack([torch.ones((), device=act.device), act.sum(), (accepted.float() * act).sum(),
                            done.float().reshape(())])
        p = torch.nan_to_num(big.scores[:, 1:].float().exp(), nan=0.0).cumsum(1).index_select(1, self._bidx)
        self.stats.copy_(torch.cat([head, (p * act[:, None]).sum(0)]))

    def observe(self, row, used):
        """A round's stats as read on the host (a list), `used` the budget that round ran with. Returns
        whether every request was done after it."""
        if row[0] > 0:
            self.policy.observe_probe(row[self.HEAD:], row[1], row[2], used)
        return row[3] > 0

    def initialise(self, row):
        """The predictions of a probe run during calibration (state restored after): the first rounds'
        budget until a probe of the decoding itself is read."""
        self.policy.observe_probe(row[self.HEAD:], row[1])
        self.start = self.policy.current(self.batch)
