"""A per-round DDTree tree budget chosen from cost (the CaDDTree idea), shared by the transformers
integration and the DDTree example (examples/ddtree/engine.py).

Each round the drafter's per-depth top-K log-probs give, through tree_build's best-first scores, the
cumulative path probability of every node the tree would hold. A best-first tree of budget n holds the
n highest-scoring nodes, and the target accepts a node exactly when its whole path is the target's
path, so with a calibrated drafter the expected accepted tokens of request b are
E_b(n) = sum of exp(score) over the first n nodes of the largest tree (tree_build pops nodes in
non-increasing score order, so the budget-n tree is a prefix of the largest one). The round's budget
maximises (active requests + c * sum_b E_b(n)) / cost(B, n): tokens per second of the step, where
cost(B, n) is the step's measured time at this batch and budget (a table measured once per batch size,
so nobody has to say the batch size) and c an online correction of the drafter's calibration
(accepted / predicted over the rounds so far).
"""
from __future__ import annotations

import statistics
import time

import torch

# The fixed budgets the DDTree example measures; auto chooses among the same trees each round.
DEFAULT_BUDGETS = (4, 8, 16, 32, 64, 127)


def expected_accepts(scores: torch.Tensor, budgets) -> torch.Tensor:
    """scores [B, W] float32 of a best-first tree (node 0 the root; absent nodes -inf) -> [B, len(budgets)]
    expected accepted draft tokens under the drafter's own probabilities for each budget (<= W - 1)."""
    p = torch.nan_to_num(scores[:, 1:].float().exp(), nan=0.0)
    cum = p.cumsum(1)
    idx = torch.as_tensor([b - 1 for b in budgets], device=scores.device)
    return cum.index_select(1, idx)


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
        """run_step(budget) runs one step (state restored by the caller); the median of `repeats` after a
        warm-up is stored for each budget."""
        for b in budgets:
            run_step(b)
            if sync:
                sync()
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                run_step(b)
                if sync:
                    sync()
                times.append(time.perf_counter() - t)
            self.set(batch, b, statistics.median(times))


class BudgetPolicy:
    """Chooses each round's budget among `budgets` from the largest tree's scores and the cost table."""

    def __init__(self, budgets=DEFAULT_BUDGETS, costs: CostTable | None = None, *, calibrate=True, prior=20.0):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs if costs is not None else CostTable()
        self.calibrate = calibrate
        # accepted / predicted so far, starting from `prior` rounds' worth of "calibrated" (ratio 1)
        self._acc, self._pred = prior, prior
        self._last_pred = None
        self.history = []  # chosen budgets, for reports

    @property
    def correction(self) -> float:
        return self._acc / self._pred if self.calibrate else 1.0

    def choose(self, scores: torch.Tensor, active: torch.Tensor, batch: int, prev_accepted=None) -> int:
        """One host read per round (the budget decides the next tensors' shapes). prev_accepted: the
        previous round's accepted draft tokens summed over its active requests (a device scalar, read in
        the same transfer), which updates the calibration."""
        e = expected_accepts(scores, self.budgets) * active[:, None].float()  # [B, n_budgets]
        parts = [e.sum(0), active.float().sum().view(1)]
        if prev_accepted is not None:
            parts.append(prev_accepted.float().view(1))
        total = torch.cat(parts).tolist()
        if prev_accepted is not None:
            self.observe(total.pop())
        pred, n_active = total[:-1], max(total[-1], 1.0)
        c = self.correction
        best, best_rate = self.budgets[0], -1.0
        for b, p in zip(self.budgets, pred):
            rate = (n_active + c * p) / self.costs.get(batch, b)
            if rate > best_rate:
                best, best_rate = b, rate
        self._last_pred = pred[self.budgets.index(best)]
        self.history.append(best)
        return best

    def observe(self, accepted_total: float):
        """The accepted draft tokens of the round just chosen (summed over the active requests)."""
        if self._last_pred is not None:
            self._acc += accepted_total
            self._pred += self._last_pred
            self._last_pred = None
