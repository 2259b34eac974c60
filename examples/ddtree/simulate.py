"""Budget policies judged offline on a teacher-forced trace (examples/ddtree/trace.py): exact acceptance, the
measured round costs, no GPU.

A simulated run decodes a prompt group as generate() does: each round the policy picks a budget, every request
still decoding accepts counts[g, budget] draft tokens at its generated count g (the trace's counterfactual
table) and moves on by that + 1, and the round costs the batch's measured time at that budget; the host reads a
round's numbers `lag` rounds late (RoundLog), so the last `lag` rounds run past the end as in generate().
Batch 1 decodes its prompts one at a time (tokens/s = all tokens / total time), as run.py measures it.

    python -m examples.ddtree.simulate trace.npz [--budgets 4,8,16,32,64,127] [--resample 12] [--serve 9] [--oracle]
        [--confidence] [--alloc] [--cost-noise jitter=0.03,outliers=0.02:2,inflate=31:1.15]

prints tokens/s by fixed budget and of budget "auto" (kdtree.integrations.budget's policy, replayed with its
calibration) per batch size; --resample, --serve, --oracle and --confidence add the comparisons
examples/ddtree/README.md reports. The premise is the trace's: a text that does not depend on the budget (the
trace's text check says how far that held).

Auto's cost table holds the trace's exact costs unless --cost-noise says what its timer reads (`CostNoise`): then
its calibration bursts (6 rounds a budget) and every replayed round, read `lag` rounds late as the engine reads
them, join the table as the true cost times the noise (CostTable.measure and CostTable.observe, AutoBudget.observe's
path for a round's `seconds`). SPEC: comma-separated of jitter=S (lognormal, sigma S), outliers=P:F (a reading is
F x the cost with probability P), inflate=B:F (budget B's calibration readings are F x its cost, at every batch
size: the H100 failure of examples/ddtree/README.md). The replay's time stays the true cost: the noise is only
what the table reads.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from kdtree.integrations.allocate import allocate, behind, nodes_by_budget
from kdtree.integrations.budget import AutoBudget, CostTable, counterfactual_accepts, DEFAULT_BUDGETS

from .engine import tree_width


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

    def observe(self, counts, active, used, accepted=None, seconds=None):
        pass


class CostNoise:
    """--cost-noise SPEC (the module's docstring): multipliers of the true cost, as auto's timer reads it."""

    def __init__(self, spec, seed=0):
        self.jitter, self.p_out, self.f_out, self.inflate = 0.0, 0.0, 1.0, {}
        for part in filter(None, spec.split(",")):
            key, _, val = part.partition("=")
            if key == "jitter":
                self.jitter = float(val)
            elif key == "outliers":
                p, f = val.split(":")
                self.p_out, self.f_out = float(p), float(f)
            elif key == "inflate":
                b, f = val.split(":")
                self.inflate[int(b)] = float(f)
            else:
                raise ValueError(f"--cost-noise: unknown part {part!r} (jitter=S, outliers=P:F, inflate=B:F)")
        self.rng = np.random.default_rng(seed)

    def readings(self, n):
        x = np.exp(self.rng.normal(0.0, self.jitter, n)) if self.jitter else np.ones(n)
        return np.where(self.rng.random(n) < self.p_out, self.f_out, 1.0) * x

    def calibration(self, budget, n):
        return self.inflate.get(budget, 1.0) * self.readings(n)


def cost_noise(spec, seed):
    """--cost-noise's CostNoise, None for "" (exact costs)."""
    return CostNoise(spec, seed) if spec else None


class Auto:
    """kdtree.integrations.budget.AutoBudget itself, fed a trace's counts instead of device rows: calibrated once per
    batch size (a round at the largest budget from the admitted state, then its burst's later rounds), then one
    plan per round from the rounds read so far. alloc: the rounds allocate their nodes over the batch (the
    counts run_group hands it are then the allocation's at each budget; its calibration reads uniform ones).
    noise: a CostNoise, or None (the table holds the exact costs, no round's time joins it)."""

    def __init__(self, budgets, costs_by_batch, *, calibration_rounds=6, lag=2, alloc=False, noise=None):
        self.budgets = tuple(sorted(budgets))
        self.costs_by_batch, self.cal, self.lag = costs_by_batch, calibration_rounds, lag
        self.alloc, self.noise = alloc, noise
        self.auto = None

    @property
    def history(self):
        """The budgets planned at this batch size (AutoBudget's policy keeps them)."""
        return self.auto.policy.history

    def start(self, batch, max_new):
        if self.auto is None or self.auto.batch != batch:
            table = CostTable()
            if self.noise is None:
                for b in self.budgets:
                    table.set(batch, b, self.costs_by_batch[b])
            else:
                table.measure(batch, self.budgets,
                              lambda b: self.costs_by_batch[b] * self.noise.calibration(b, self.cal))
            self.auto = AutoBudget(self.budgets, table, "cpu", depth=1,  # its device rows are not used here
                                   alloc_cap=(lambda b: tree_width(b) - 1) if self.alloc else None)
            self.calibrate = True
        self.auto.reset(batch, max_new)

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
            self.auto.observe_counts(c, np.ones(R, bool), self.budgets[-1], advance=False)
            g = g + 1 + c[:, -1]

    def plan(self):
        return self.auto.plan()

    def observe(self, counts, active, used, accepted=None, seconds=None):
        if self.noise is not None:
            # AutoBudget.observe's step for a round's `seconds`, its rows being counts here
            self.auto.costs.observe(self.auto.batch, used, seconds * self.noise.readings(1)[0])
        self.auto.observe_counts(counts, active, used, accepted=accepted)


def allocated_round(paths, scores, active, budget, budgets, remaining=None):
    """kdtree.integrations.allocate over a trace's round at `budget`: paths [R, D] (the budget-127 tree's accepted
    path, node indices, -1 past it), scores [R, 128]; the R x budget best nodes 1..cap over the batch (the
    engine's cap_of: the trace's trees are 127 nodes, never smaller than a width), done requests' last;
    remaining [R] (optional): each request's tokens still to generate, weighting its nodes as the engine does
    (allocate.behind).
    Returns (accepted draft tokens [R]: the path's nodes within each request's share, a prefix; [R, K] what
    each of `budgets` would have accepted under its own allocation, as AutoBudget reads an allocated round)."""
    sc, act = torch.from_numpy(np.ascontiguousarray(scores)), torch.from_numpy(np.asarray(active, dtype=bool))
    R = sc.shape[0]
    w = None if remaining is None else behind(torch.from_numpy(np.asarray(remaining)))
    a = allocate(sc, act, R * budget, tree_width(budget) - 1, w)
    nodes = (a.counts - 1).numpy().astype(np.int64)
    p = paths.astype(np.int64)
    acc = np.cumprod((p >= 0) & (p <= nodes[:, None]), 1).sum(1)
    by_budget = nodes_by_budget(a, R * torch.tensor(budgets), [tree_width(b) - 1 for b in budgets]).numpy()
    return acc, counterfactual_accepts((p >= 0).sum(1), p, by_budget)


def run_group(counts, budgets, costs, policy, *, max_new, lag=2, alloc=None):
    """One prompt group decoded to max_new tokens each: (seconds, rounds). counts [G, R, K] over `budgets`,
    costs {budget: seconds a round} at this batch size (a round allocated over the batch costs its budget's:
    the same rows and width). alloc: (paths [G, R, D], scores [G, R, 128]) of the group: each round's B x budget
    nodes are allocated over the batch (allocated_round) instead of budget per request."""
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
        gi = np.minimum(g, G - 1)
        c = counts[gi, np.arange(R)]
        if alloc is None:
            acc = c[:, col[b]]
        else:
            acc, c = allocated_round(alloc[0][gi, np.arange(R)], alloc[1][gi, np.arange(R)], active, b, budgets,
                                     max_new - g)
        g = np.where(active, g + 1 + acc, g)
        pending.append((c, active, b, acc))
        if len(pending) > lag:
            pc, pa, pb, pacc = pending.pop(0)
            policy.observe(pc, pa, pb, accepted=pacc, seconds=costs[pb])
        if done_at is None and (g >= max_new).all():
            done_at = rounds
        if done_at is not None and rounds >= done_at + lag:
            return seconds, rounds


def tokens_per_s(groups_counts, budgets, costs, policy, *, max_new, lag=2, allocs=None):
    """All tokens over the total time of decoding every group in turn (one policy object throughout); allocs:
    per group, run_group's alloc."""
    secs = tokens = 0
    for i, counts in enumerate(groups_counts):
        s, _ = run_group(counts, budgets, costs, policy, max_new=max_new, lag=lag,
                         alloc=None if allocs is None else allocs[i])
        secs += s
        tokens += counts.shape[1] * max_new
    return tokens / secs


def groups_of(group, key="paths"):
    """A trace group's `key` array as run.py decodes the group: batch 1's requests one at a time, else one batch."""
    if group["batch"] == 1:
        return [group[key][:, r:r + 1] for r in range(group[key].shape[1])]
    return [group[key]]


def resampled(paths, batch, n, rng, prompts_b1=8):
    """n random prompt groups at `batch` from every traced request (paths [G, R_all, D]), each decoded as run.py
    decodes its groups: at batch 1, `prompts_b1` requests one at a time."""
    R = paths.shape[1]
    if batch == 1:
        return [[paths[:, i:i + 1] for i in rng.choice(R, min(prompts_b1, R), replace=False)] for _ in range(n)]
    if batch > R:
        raise ValueError(f"resampled: {R} traced requests cannot make groups of {batch}")
    return [[paths[:, rng.choice(R, batch, replace=False)]] for _ in range(n)]


def _greedy_seconds(counts, gain, cost, *, max_new, lag):
    """One request decoded choosing each round's budget k for the best (1 + gain[g, k]) / cost[k] at its
    generated count g, moving on by the tokens counts[g, k] it accepts: seconds, with generate()'s `lag` rounds
    past the end at the last budget chosen."""
    g, t, k = 0, 0.0, 0
    while g < max_new:
        k = int(np.argmax((1 + gain[g]) / cost))
        t, g = t + cost[k], g + 1 + int(counts[g, k])
    return t + lag * cost[k]


def oracle_times(counts, costs, budgets, *, max_new, lag=2):
    """One request (counts [G, K]) decoded knowing every round's outcome: (seconds choosing each round's budget
    for the best tokens per second of that round, seconds of the whole decode planned by dynamic programming),
    each with the `lag` rounds generate() runs past the end at the last budget chosen."""
    cost = np.asarray([costs[b] for b in budgets])
    myopic = _greedy_seconds(counts, counts, cost, max_new=max_new, lag=lag)
    best = np.zeros(max_new + int(counts.max()) + 2)  # seconds from count g to the end; 0 past max_new
    for g in range(max_new - 1, -1, -1):
        nxt = g + 1 + counts[g]
        best[g] = np.min(cost + np.where(nxt >= max_new, lag * cost, best[nxt]))
    return myopic, best[0]


def confidence_seconds(counts, scores, costs, budgets, kappa, *, max_new, lag=2):
    """One request decoded with each round's budget chosen from its own tree (scores [G, 128], tree_build's path
    log-probabilities: a node's probability of lying on the accepted path, if the drafter is calibrated): the
    best of (1 + kappa x the expected accepted tokens of the budget's nodes) over the round's cost. No host read
    is charged, which choosing from the round's own tree would need."""
    expected = np.cumsum(np.exp(scores[:, 1:]), 1)[:, np.asarray(budgets) - 1]  # padding nodes: -inf, 0
    return _greedy_seconds(counts, kappa * expected, np.asarray([costs[b] for b in budgets]), max_new=max_new, lag=lag)


def pooled(groups):
    """Every traced request's (paths [G, R_all, D], scores [G, R_all, 128]), the groups side by side."""
    return (np.concatenate([g["paths"] for g in groups], 1), np.concatenate([g["scores"] for g in groups], 1))


def costed_budgets(meta, B, cand, fixed=None):
    """A batch size's round costs {budget: seconds}, the fixed budgets to compare (default: every costed one),
    every budget a count table needs (those and auto's candidates `cand`, sorted) and cand's columns in it."""
    costs = {int(b): s for b, s in meta["costs"][str(B)].items()}
    fixed = sorted(costs) if fixed is None else fixed
    allb = sorted(set(fixed) | set(cand))
    return costs, fixed, allb, [allb.index(b) for b in cand]


def study(meta, groups, cand, *, resample, seed=0, oracle=False, confidence=False, noise=""):
    """The comparisons of examples/ddtree/README.md ("Judging a policy offline"), printed per batch size. noise:
    --cost-noise's SPEC ("": exact costs)."""
    max_new = meta["max_new"]
    paths, scores = pooled(groups)
    rng = np.random.default_rng(seed)
    for B in meta["batches"]:
        costs, fixed, allb, col = costed_budgets(meta, B, cand)
        ratios, fixed_rates, auto_rates = [], [], []
        for i, grp in enumerate(resampled(paths, B, resample, rng) if resample else []):
            parts = [count_table(p, allb) for p in grp]
            rates = {b: tokens_per_s(parts, allb, costs, Fixed(b), max_new=max_new) for b in fixed}
            auto = Auto(cand, costs, noise=cost_noise(noise, seed + i))
            ra = tokens_per_s([p[:, :, col] for p in parts], cand, costs, auto, max_new=max_new)
            ratios.append(ra / max(rates.values()))
            fixed_rates.append(rates)
            auto_rates.append(ra)
        if resample:
            # every group decodes the same tokens: all groups' tokens/s is the harmonic mean of theirs
            whole = {b: 1.0 / np.mean([1.0 / r[b] for r in fixed_rates]) for b in fixed}
            top = max(whole, key=whole.get)
            auto_whole = 1.0 / np.mean([1.0 / r for r in auto_rates])
            print(f"batch {B:3d}, {resample} random prompt groups: auto / the best of {len(fixed)} fixed budgets per "
                  f"group: mean {np.mean(ratios):.3f}, min {np.min(ratios):.3f}; over all the groups, auto / the best "
                  f"fixed budget ({top}): {auto_whole / whole[top]:.3f}x; the best per group beats {top} by "
                  f"{np.mean([max(r.values()) / r[top] for r in fixed_rates]):.3f}x")
        if B != 1 or not (oracle or confidence):
            continue
        counts = count_table(paths, allb)  # [G, R, K]
        R = counts.shape[1]
        fixed_s = {b: sum(run_group(counts[:, r:r + 1], allb, costs, Fixed(b), max_new=max_new)[0] for r in range(R))
                   for b in fixed}
        best = min(fixed_s, key=fixed_s.get)
        line = f"batch   1, all {R} traced requests one at a time, against the best fixed budget ({best}):"
        if oracle:
            t = np.sum([oracle_times(counts[:, r, :], costs, allb, max_new=max_new) for r in range(R)], 0)
            line += f" knowing each round's outcome {fixed_s[best] / t[0]:.3f}x, the whole decode planned {fixed_s[best] / t[1]:.3f}x;"
        if confidence:
            ks = {kap: sum(confidence_seconds(counts[:, r, :], scores[:, r, :], costs, allb, kap, max_new=max_new)
                           for r in range(R)) for kap in (1.0, 1.3, 1.5)}
            line += " from the tree's path probabilities " + ", ".join(
                f"{fixed_s[best] / t:.3f}x (kappa {kap})" for kap, t in ks.items())
        print(line)


def serve(meta, groups, cand, *, n, seed=0, alloc=False, noise=""):
    """A server's view: n random prompt groups per batch size (> 1) decoded in turn through one auto policy
    (calibrated on the first group only, as the engine calibrates once per batch size), against every fixed
    budget over the same groups after the first. Every other comparison here replays a group's first decode
    after a calibration over its own prompts, whose per-request statistics a later batch of new prompts does
    not have. alloc: every round's nodes allocated over the batch, auto's and the fixed budgets'. noise: as study's.
    Returns {batch: (auto tokens/s, {fixed budget: tokens/s}, auto's budget histogram)}."""
    max_new = meta["max_new"]
    paths, scores = pooled(groups)
    R = paths.shape[1]
    out = {}
    for B in meta["batches"]:
        if B == 1 or B > R:
            continue
        costs, fixed, allb, col = costed_budgets(meta, B, cand)
        rng = np.random.default_rng(seed)
        auto = Auto(cand, costs, alloc=alloc, noise=cost_noise(noise, seed))
        secs_auto, secs_fixed, hist = 0.0, {b: 0.0 for b in fixed}, []
        for i in range(n + 1):
            pick = rng.choice(R, B, replace=False)
            counts = count_table(paths[:, pick], allb)
            al = (paths[:, pick], scores[:, pick]) if alloc else None
            start = len(auto.history) if auto.auto is not None else 0
            s, _ = run_group(counts[:, :, col], cand, costs, auto, max_new=max_new, lag=2, alloc=al)
            if i == 0:
                continue  # the calibration's group
            secs_auto += s
            hist += auto.history[start:]
            for b in fixed:
                secs_fixed[b] += run_group(counts, allb, costs, Fixed(b), max_new=max_new, alloc=al)[0]
        tokens = n * B * max_new
        out[B] = (tokens / secs_auto, {b: tokens / t for b, t in secs_fixed.items()},
                  {b: hist.count(b) for b in sorted(set(hist))})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--budgets", default=",".join(map(str, DEFAULT_BUDGETS)), help="auto's candidates")
    ap.add_argument("--fixed", default="", help="fixed budgets to list (default: every budget the trace costed)")
    ap.add_argument("--resample", type=int, default=0,
                    help="also judge auto over N random prompt groups per batch size, drawn from every traced request, "
                         "against the best of every costed fixed budget in each group")
    ap.add_argument("--oracle", action="store_true",
                    help="batch 1: what a policy knowing each round's outcome reaches (round by round; planned)")
    ap.add_argument("--confidence", action="store_true",
                    help="batch 1: each round's budget from its tree's path probabilities")
    ap.add_argument("--seed", type=int, default=0, help="of --resample's groups and --cost-noise's readings")
    ap.add_argument("--serve", type=int, default=0,
                    help="also decode N random prompt groups per batch size in turn through one auto policy (calibrated "
                         "on a group before them), as a server does, against every fixed budget over the same groups")
    ap.add_argument("--alloc", action="store_true",
                    help="also decode each fixed budget and auto with every round's nodes allocated over the batch "
                         "(kdtree.integrations.allocate, the example's --alloc batch)")
    ap.add_argument("--cost-noise", default="", metavar="SPEC",
                    help="what auto's timer reads: its calibration and every replayed round join its cost table as "
                         "the true cost times this noise; comma-separated jitter=S (lognormal sigma), outliers=P:F "
                         "(F x the cost with probability P), inflate=B:F (budget B's calibration F x its cost)")
    a = ap.parse_args(argv)
    meta, groups = load(a.trace)
    max_new = meta["max_new"]
    cand = tuple(int(x) for x in a.budgets.split(","))
    print(f"trace: {meta['weights']} weights, {max_new} new tokens; text check (requests identical to a fixed-"
          f"budget decode): {meta['text_check']}")
    for grp in groups:
        B = grp["batch"]
        listed = [int(x) for x in a.fixed.split(",")] if a.fixed else None
        costs, fixed, allb, col = costed_budgets(meta, B, cand, listed)
        parts = [count_table(p, allb) for p in groups_of(grp)]
        rates = {b: tokens_per_s(parts, allb, costs, Fixed(b), max_new=max_new) for b in fixed}
        best = max(rates, key=rates.get)
        sub = [p[:, :, col] for p in parts]
        auto = Auto(cand, costs, noise=cost_noise(a.cost_noise, a.seed))
        ra = tokens_per_s(sub, cand, costs, auto, max_new=max_new)
        hist = {b: auto.history.count(b) for b in sorted(set(auto.history))}
        print(f"batch {B:3d}: fixed " + " ".join(f"{b}:{r:.0f}" for b, r in rates.items())
              + f"\n           best fixed {best} ({rates[best]:.0f} tok/s); auto {ra:.0f} tok/s = "
              f"{ra / rates[best]:.3f}x, budgets {hist}")
        if a.alloc:
            allocs = list(zip(groups_of(grp), groups_of(grp, "scores")))
            arates = {b: tokens_per_s(parts, allb, costs, Fixed(b), max_new=max_new, allocs=allocs) for b in fixed}
            abest = max(arates, key=arates.get)
            auto = Auto(cand, costs, alloc=True, noise=cost_noise(a.cost_noise, a.seed))
            raa = tokens_per_s(sub, cand, costs, auto, max_new=max_new, allocs=allocs)
            hist = {b: auto.history.count(b) for b in sorted(set(auto.history))}
            print(f"           allocated over the batch: fixed " + " ".join(f"{b}:{r:.0f}" for b, r in arates.items())
                  + f"\n           best {abest} ({arates[abest]:.0f} tok/s = {arates[abest] / rates[best]:.3f}x the best "
                  f"fixed); auto {raa:.0f} tok/s = {raa / rates[best]:.3f}x the best fixed, budgets {hist}")
    for alloc in ((False, True) if a.alloc else (False,)) if a.serve else ():
        for B, (ra, rates, hist) in serve(meta, groups, cand, n=a.serve, seed=a.seed, alloc=alloc,
                                                  noise=a.cost_noise).items():
            best = max(rates, key=rates.get)
            print(f"batch {B:3d}, {a.serve} prompt groups in turn through one policy"
                  f"{' (allocated over the batch)' if alloc else ''}: auto {ra:.0f} tok/s = {ra / rates[best]:.3f}x "
                  f"the best fixed budget over them ({best}: {rates[best]:.0f}), budgets {hist}")
    if a.resample or a.oracle or a.confidence:
        study(meta, groups, cand, resample=a.resample, seed=a.seed, oracle=a.oracle, confidence=a.confidence,
              noise=a.cost_noise)


if __name__ == "__main__":
    main()
