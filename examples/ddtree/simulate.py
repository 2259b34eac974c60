"""Budget policies judged offline on a teacher-forced trace (examples/ddtree/trace.py): exact acceptance, the
measured round costs, no GPU.

A simulated run decodes a prompt group as generate() does: each round the policy picks a budget, every request
still decoding accepts counts[g, budget] draft tokens at its generated count g (the trace's counterfactual
table) and moves on by that + 1, and the round costs the batch's measured time at that budget; the host reads a
round's numbers `lag` rounds late (RoundLog), so the last `lag` rounds run past the end as in generate().
Batch 1 decodes its prompts one at a time (tokens/s = all tokens / total time), as run.py measures it.

    python -m examples.ddtree.simulate trace.npz [--budgets 4,8,16,32,64,127]

prints tokens/s by fixed budget and of budget "auto" (kdtree.integrations.budget's policy, replayed with its
calibration) per batch size. The premise is the trace's: a text that does not depend on the budget (the
trace's text check says how far that held).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from kdtree.integrations.budget import BudgetPolicy, CostTable, counterfactual_accepts, DEFAULT_BUDGETS


def load(path):
    """(meta dict, groups): groups[i] = dict(batch, paths [G, R, D], scores [G, R, 128], tokens [R, G])."""
    z = np.load(path)
    meta = json.loads(str(z["meta"]))
    groups = [{"batch": B, **{k: z[f"g{i}_{k}"] for k in ("paths", "scores", "tokens")}}
              for i, B in enumerate(meta["batches"])]
    return meta, groups


def count_table(paths, budgets):
    """[G, R, K]: the draft tokens budget budgets[k] accepts at generated count g for request r."""
    G, R, D = paths.shape
    acc = (paths >= 0).sum(2).reshape(-1)
    return counterfactual_accepts(acc, paths.reshape(G * R, D), budgets).reshape(G, R, len(budgets))


class Fixed:
    def __init__(self, budget):
        self.budget = budget

    def start(self, batch, max_new):
        pass

    def plan(self):
        return self.budget

    def observe(self, counts, active, used):
        pass


class Auto:
    """kdtree.integrations.budget's policy as AutoBudget runs it: calibrated once per batch size (a round at the
    largest budget from the admitted state, then its burst's later rounds), then one plan per round from the
    rounds read so far."""

    def __init__(self, budgets, costs_by_batch, *, calibration_rounds=6, lag=2, policy_kw=None):
        self.budgets = tuple(sorted(budgets))
        self.costs_by_batch, self.cal, self.lag = costs_by_batch, calibration_rounds, lag
        self.policy_kw = policy_kw or {}
        self.batch = None
        self.history = []

    def start(self, batch, max_new):
        self.max_new = max_new
        if self.batch != batch:
            table = CostTable()
            for b in self.budgets:
                table.set(batch, b, self.costs_by_batch[b])
            self.policy = BudgetPolicy(self.budgets, table, **self.policy_kw)
            self.batch, self.calibrate = batch, True
        self.policy.requests(batch)
        self.gen = np.zeros(batch, dtype=np.int64)

    def calibration(self, counts):
        """counts [G, R, K]: what AutoBudget.calibrate observes, once per batch size: its round at the largest
        budget from generated count 0, then that budget's burst (the same round again and rounds + lag more,
        back to back from count 0), whose later rounds it reads too: the largest budget's walk, counts 0..8."""
        if not self.calibrate:
            return
        self.calibrate = False
        G, R, _ = counts.shape
        g = np.zeros(R, dtype=np.int64)
        for _ in range(self.cal + self.lag + 1):
            c = counts[np.minimum(g, G - 1), np.arange(R)]
            self.policy.add(c, np.ones(R, bool), self.budgets[-1])
            g = g + 1 + c[:, -1]

    def plan(self):
        b = self.policy.best(self.batch, self.max_new - self.gen)
        b = self.budgets[len(self.budgets) // 2] if b is None else b
        self.history.append(b)
        return b

    def observe(self, counts, active, used):
        self.policy.add(counts, active, used)
        self.gen[active] += counts[active, self.budgets.index(used)] + 1


def run_group(counts, budgets, costs, policy, *, max_new, lag=2):
    """One prompt group decoded to max_new tokens each: (seconds, rounds). counts [G, R, K] over `budgets`,
    costs {budget: seconds a round} at this batch size."""
    G, R, K = counts.shape
    col = {b: k for k, b in enumerate(budgets)}
    policy.start(R, max_new)
    if hasattr(policy, "calibration"):
        policy.calibration(counts)
    g = np.zeros(R, dtype=np.int64)
    pending, seconds, rounds = [], 0.0, 0
    done_at = None
    while True:
        b = policy.plan()
        seconds += costs[b]
        rounds += 1
        active = g < max_new
        c = counts[np.minimum(g, G - 1), np.arange(R)]
        g = np.where(active, g + 1 + c[:, col[b]], g)
        pending.append((c, active, b))
        if len(pending) > lag:
            pc, pa, pb = pending.pop(0)
            policy.observe(pc, pa, pb)
        if done_at is None and (g >= max_new).all():
            done_at = rounds
        if done_at is not None and rounds >= done_at + lag:
            return seconds, rounds


def tokens_per_s(groups_counts, budgets, costs, policy, *, max_new, lag=2):
    """All tokens over the total time of decoding every group in turn (one policy object throughout)."""
    secs = tokens = 0
    for counts in groups_counts:
        s, _ = run_group(counts, budgets, costs, policy, max_new=max_new, lag=lag)
        secs += s
        tokens += counts.shape[1] * max_new
    return tokens / secs


def groups_of(group):
    """A trace group as run.py decodes it: batch 1's requests one at a time, else one batch."""
    if group["batch"] == 1:
        return [group["paths"][:, r:r + 1] for r in range(group["paths"].shape[1])]
    return [group["paths"]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="auto's candidates")
    ap.add_argument("--fixed", default="", help="fixed budgets to list (default: every budget the trace costed)")
    a = ap.parse_args(argv)
    meta, groups = load(a.trace)
    max_new = meta["max_new"]
    cand = tuple(int(x) for x in a.budgets.split(","))
    print(f"trace: {meta['weights']} weights, {max_new} new tokens; text check (requests identical to a fixed-"
          f"budget decode): {meta['text_check']}")
    for grp in groups:
        B = grp["batch"]
        costs = {int(b): s for b, s in meta["costs"][str(B)].items()}
        fixed = [int(x) for x in a.fixed.split(",")] if a.fixed else sorted(costs)
        allb = sorted(set(fixed) | set(cand))
        parts = [count_table(p, allb) for p in groups_of(grp)]
        rates = {b: tokens_per_s(parts, allb, costs, Fixed(b), max_new=max_new) for b in fixed}
        best = max(rates, key=rates.get)
        sub = [p[:, :, [allb.index(b) for b in cand]] for p in parts]
        auto = Auto(cand, costs)
        ra = tokens_per_s(sub, cand, costs, auto, max_new=max_new)
        hist = {b: auto.history.count(b) for b in sorted(set(auto.history))}
        print(f"batch {B:3d}: fixed " + " ".join(f"{b}:{r:.0f}" for b, r in rates.items())
              + f"\n           best fixed {best} ({rates[best]:.0f} tok/s); auto {ra:.0f} tok/s = "
              f"{ra / rates[best]:.3f}x, budgets {hist}")


if __name__ == "__main__":
    main()
