"""A per-round DDTree tree budget chosen from cost (the CaDDTree idea), shared by the transformers
integration and the DDTree example (examples/ddtree/engine.py).

The budget maximises the decoding rate: tokens per request and round, 1 + a(n), over the round's measured
time cost(B, n) at this batch size (`CostTable`, so nobody has to say the batch). A round's cost is its steady
time in the running loop, which is what a round timed alone misses: with the host ahead, rounds overlap the
host's issue of the next round with the device's work, so an eager round (transformers) costs the larger of
the two, not their sum. So the table is calibrated once per batch size with bursts of rounds run back to back
as the loop runs them (`steady_round_seconds`), each timed by the device's clock between consecutive rounds'
events, and then follows the loop's own rounds, timed the same way and read with the round's numbers
(`RoundLog`), as the median of each budget's latest samples, read non-decreasing in the budget from above (a
budget's cost is the least median of it and the larger budgets: `CostTable` says why).
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
is done, so the policy minimises cost(n) x max over requests of (tokens left / (1 + a_b(n)) + LAST_ROUND), with
each request's a_b shrunk towards the batch's (`BudgetPolicy`). With one request, or early, that is the mean
rate.

`AutoBudget` runs it without a host synchronisation in a round: the round writes its accepted counts and paths
into one small device buffer at a fixed address (so a round can be a CUDA graph); the host copies it with the
round, with an event for the round's time, and reads both `lag` rounds late (the buffer also tells the host
when every request is done: the host follows each request's generated count). The tree is built at the
round's own budget: no probe rounds.
"""
from __future__ import annotations

import statistics
import time
from collections import deque

import numpy as np
import torch

from .allocate import behind, nodes_by_budget, rank

# auto's candidate budgets. A round's cost steps up with the tree width W (kdtree's 16, 32, 64, 128: the
# attention's tiles) and grows slowly with the node count within one width (the target's rows), so 15, 31, 63 and
# 127 fill their widths (root + budget = W) and 16, 32 or 64 would pay for the next width for one node more: on
# the H200 with the DDTree example's model, 31 against 32 cost 1.517 against 1.660 ms at batch 4 (9% less for
# the same acceptance). Below 16 the target's rows are the whole difference, which matters at large batches
# (batch 64: 2.10 ms at budget 2, 2.41 at 4, 3.29 at 8), hence the fine steps there. Chosen with
# examples/ddtree/simulate.py over a teacher-forced trace of the example (examples/ddtree/README.md).
DEFAULT_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 15, 31, 63, 127)

# Rounds a request with r tokens left still needs at 1 + a tokens a round: r / (1 + a) + LAST_ROUND. Its last
# round's tokens overshoot the end (a renewal process's overshoot: E[X^2] / 2E[X]^2 rounds, at least 1/2 for
# any X >= 1), so near the end a larger tree saves less than its rate says. (Replayed over two H100 traces,
# successive prompt groups through one policy as a server decodes them, examples/ddtree/simulate.py --serve:
# 0.2-1.2% more tokens/s at batches 16 and 64 than r / (1 + a) alone, in every case of either allocation.)
LAST_ROUND = 0.5


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
    """Seconds of one decoding round by (batch size, budget), each the median of its latest `window` samples:
    a calibration burst's rounds first, then the rounds the decoding loop runs at that budget, so the table
    follows the steady cost (the KV growing, the loop's own work). Read as a row made non-decreasing in the
    budget from above: get(B, b) is the least median of the budgets b' >= b (a larger tree never reads cheaper,
    so the timer's noise cannot favour it over a smaller one); the samples are kept as measured.

    From above, not the largest median below: a median too high stays (the loop stops running a budget that
    reads dear, so its samples never leave the window), and lifting the larger budgets to it kept the loop off
    them too (an H100 run: 31 read 1.48 ms, its fixed-budget rounds 1.28, so 63 read 1.48 for 1.36, and auto ran
    15 on 120 of 269 rounds). From above, the budget that sets a violating run's cost is its largest, which
    reads that cost with at least the others' acceptance: the loop runs it, so its own rounds correct a median
    too low. (Replayed with a noisy timer, examples/ddtree/simulate.py --cost-noise.)"""

    def __init__(self, window: int = 16):
        if window < 1:
            raise ValueError(f"CostTable: window must be >= 1, got {window}")
        self.window = int(window)
        self._samples = {}  # (batch, budget) -> deque of seconds, newest last
        self._median = {}   # (batch, budget) -> median of those

    def has(self, batch: int, budgets) -> bool:
        return all((batch, b) in self._median for b in budgets)

    def set(self, batch: int, budget: int, seconds: float):
        """One sample that replaces the budget's others."""
        self._samples[(batch, budget)] = deque(maxlen=self.window)
        self.add(batch, budget, seconds)

    def add(self, batch: int, budget: int, seconds: float):
        q = self._samples.setdefault((batch, budget), deque(maxlen=self.window))
        q.append(float(seconds))
        self._median[(batch, budget)] = statistics.median(q)

    def _read(self, batch: int) -> dict:
        """{budget: its cost as read} over the batch's row: each median capped by the least one above it."""
        out, low = {}, float("inf")
        for b, s in sorted(((b, s) for (B, b), s in self._median.items() if B == batch), reverse=True):
            low = min(low, s)
            out[b] = low
        return out

    def get(self, batch: int, budget: int) -> float:
        if (batch, budget) not in self._median:
            raise KeyError(f"CostTable: no time for budget {budget} at batch {batch}")
        return self._read(batch)[budget]

    def row_of(self, batch: int, budgets):
        """[get(batch, b) for b in budgets], with one pass over the table."""
        read = self._read(batch)
        for want in budgets:
            if want not in read:
                raise KeyError(f"CostTable: no time for budget {want} at batch {batch}")
        return [read[b] for b in budgets]

    def row(self, batch: int):
        """{budget: get(batch, budget)} of every budget the batch's row holds, by budget."""
        return dict(sorted(self._read(batch).items()))

    def measure(self, batch: int, budgets, burst):
        """burst(budget) -> the seconds of rounds at that budget (steady_round_seconds: back to back, as the
        decoding loop runs them; the caller restores the state after them): they become the budget's samples."""
        for b in sorted(budgets):
            secs = [float(x) for x in burst(b)]
            if not secs:
                raise ValueError(f"CostTable.measure: the burst at budget {b} timed no round")
            self._samples[(batch, b)] = deque(maxlen=self.window)
            for x in secs:
                self.add(batch, b, x)

    def observe(self, batch: int, budget: int, seconds: float):
        """A round's time as the decoding loop ran it joins the budget's samples (a budget the table lacks is
        ignored: every row starts from a calibration, so no budget is judged on one round)."""
        if (batch, budget) in self._median:
            self.add(batch, budget, seconds)


class _WallEvent:
    """torch.cuda.Event's part RoundLog uses, for a CPU device: the host's clock when recorded (a CPU op is
    done when it returns)."""

    def __init__(self):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end) -> float:
        return 1e3 * (end.t - self.t)


class RoundLog:
    """What the host learns of each decoding round, `lag` rounds late, with no host synchronisation inside a
    round: after a round, `push` queues a copy of a small device tensor (AutoBudget.stats, or an "all done"
    flag) into pinned memory and records an event; `pop` waits for the oldest unread round's event and returns
    its row, the tag it was pushed with (the round's budget) and its time: the device clock from the previous
    round's event to its own, None for the first round pushed. With the host `lag` rounds ahead that interval is
    the round's steady cost: its device time when the device is the bottleneck, the host's time to issue it (and
    run the loop) when the host is (eager steps), which a round timed alone, synchronised, misses. On a CPU
    device the events are the host's clock. `event`: an event factory (tests)."""

    def __init__(self, like: torch.Tensor, lag: int, *, event=None):
        if lag < 0:
            raise ValueError(f"RoundLog: lag must be >= 0, got {lag}")
        cuda = like.device.type == "cuda"
        self.lag = int(lag)
        n = self.lag + 2  # the previous round's event must outlive the read of a round
        self.rows = torch.zeros((n,) + tuple(like.shape), dtype=like.dtype, pin_memory=cuda)
        if event is None:
            event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else _WallEvent
        self.events = [event() for _ in range(n)]
        self.tags = [None] * n
        self.pushed = self.read = 0

    def pending(self) -> int:
        return self.pushed - self.read

    def ready(self) -> bool:
        """Whether the oldest unread round is `lag` rounds old (the loop reads it now)."""
        return self.pending() > self.lag

    def push(self, src: torch.Tensor, tag=None):
        if self.pending() > self.lag:
            raise RuntimeError(f"RoundLog: {self.pending()} rounds unread with lag {self.lag}; pop before pushing "
                               f"(the ring would overwrite an unread row)")
        i = self.pushed % len(self.events)
        self.rows[i].copy_(src, non_blocking=True)
        self.events[i].record()
        self.tags[i] = tag
        self.pushed += 1

    def pop(self):
        """(row as a numpy array, tag, seconds since the previous round or None) of the oldest unread round."""
        if not self.pending():
            raise RuntimeError("RoundLog: no round to read")
        n, j = len(self.events), self.read
        self.events[j % n].synchronize()
        secs = None if j == 0 else self.events[(j - 1) % n].elapsed_time(self.events[j % n]) / 1e3
        self.read += 1
        return self.rows[j % n].numpy().copy(), self.tags[j % n], secs


def steady_round_seconds(run_round, stats: torch.Tensor, rounds: int, *, lag: int = 2, host_work=None, event=None):
    """Runs rounds back to back as the decoding loop does (each round's `stats` pushed to a RoundLog and read
    `lag` rounds late, `host_work(row)` standing in for the loop's own work on a row; no host synchronisation
    between rounds) and returns (`rounds` steady round times, the rows of every round run, in order). The first
    lag + 1 rounds fill the pipeline (their rounds had no read behind them yet), so rounds + lag + 1 run. The
    caller restores the state the rounds advanced."""
    if rounds < 1:
        raise ValueError(f"steady_round_seconds: rounds must be >= 1, got {rounds}")
    log = RoundLog(stats, lag, event=event)
    secs, rows = [], []

    def read():
        row, _, s = log.pop()
        rows.append(row)
        if s is not None:
            secs.append(s)
        if host_work is not None:
            host_work(row)

    for _ in range(rounds + lag + 1):
        run_round()
        log.push(stats)
        if log.ready():
            read()
    while log.pending():
        read()
    return secs[lag:], rows


def counterfactual_accepts(accepted, paths, budgets) -> np.ndarray:
    """What each budget would have accepted in a round, from the path the round accepted: accepted [B] the
    round's accepted draft tokens per request (-1: the request was not decoding), paths [B, L] the accepted
    path's node indices after the root (path[:, 1:] of tree_accept; entries past `accepted` are ignored) ->
    [B, len(budgets)] int: the budget-m tree is the first m + 1 nodes of the round's tree, so budget m accepts
    the path's nodes of index <= m (a prefix of the path: indices grow along it). Exact for every m up to the
    round's own budget; larger ones read as the round's own count. budgets [K], or [B, K]: each request's
    own draft nodes at each budget (a round allocated over the batch, allocate.nodes_by_budget)."""
    acc = np.asarray(accepted).reshape(-1)
    p = np.asarray(paths).reshape(acc.shape[0], -1)
    valid = np.arange(p.shape[1])[None, :] < acc[:, None]
    bud = np.asarray(budgets)
    bud = bud[None, :] if bud.ndim == 1 else bud  # [1, K], or [B, K]: each request's own nodes at budget k
    return ((p[:, :, None] <= bud[:, None, :]) & valid[:, :, None]).sum(1)


class BudgetPolicy:
    """Chooses the budget among `budgets` from counterfactual accepted counts and the cost table.

    Statistics, per candidate budget k (observations: one per decoding request and round whose budget was at
    least budgets[k]): S[k] the accepted draft tokens at budgets[k], P[k] those at budgets[k-1] in the same
    observations, C[k] their number. a(budgets[0]) = S[0] / C[0] and each step up adds its paired increment
    (S[k] - P[k]) / C[k], whose variance is far smaller than that of two separate means. The batch's sums of
    budget k decay by `decay` per round's worth of new observations of k (decay ** (observations / batch)):
    the requests still decoding matter, and a new prompt's text, but what no round observes (budgets above
    the ones run, the tail of a static batch) keeps its last measurement instead of fading back to the
    optimistic bound below, which made auto re-try larger trees every few dozen rounds (batch 1 on the H200:
    budget 64 or 127 on 45 of 247 rounds where 32 was best, none with this rule). Each request's own
    sums do not decay, and its estimate is shrunk towards the batch's with `shrink` pseudo-observations.

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

    def add(self, counts, active, used):
        """One round's numbers: counts [B, K] from counterfactual_accepts, active [B] bool (the requests the
        round decoded), used: the round's budget, or [B] each request's draft nodes (a round whose nodes were
        allocated over the batch, kdtree.integrations.allocate); only budgets <= used are observed."""
        counts = np.asarray(counts, dtype=np.float64)
        used = np.broadcast_to(np.asarray(used), (counts.shape[0],))
        obs = (np.asarray(active, dtype=bool)[:, None] & (self._bud[None, :] <= used[:, None])).astype(np.float64)
        lower = np.concatenate([np.zeros((counts.shape[0], 1)), counts[:, :-1]], 1)
        # Each budget's sums forget in proportion to what this round observed of it (a full batch: decay).
        keep = self.decay ** (obs.sum(0) / max(counts.shape[0], 1))
        for tot, x in ((self.S, counts), (self.P, lower), (self.C, 1.0)):
            tot *= keep
            tot += (x * obs).sum(0)
        self.rS += counts * obs
        self.rP += lower * obs
        self.rC += obs

    def _chain(self, S, P, C):
        """The batch's a(budgets[k]) for every k ([K]) from its sums S, P, C ([K]), each increment pulled towards the
        optimistic bound (the previous increment; the first: a(budgets[0])) with weight self.prior. Python floats:
        the loop runs every round, on the host's time between rounds."""
        S, P, C = S.tolist(), P.tolist(), C.tolist()
        a = [S[0] / max(C[0], 1e-9)]
        bound = a[0]
        for k in range(1, len(S)):
            bound = max((S[k] - P[k] + self.prior * bound) / (C[k] + self.prior), 0.0)
            a.append(a[-1] + bound)
        return np.asarray(a)

    def _chain_requests(self, S, P, C, base, inc):
        """Each request's a(budgets[k]) ([R, K]) from its sums ([R, K]), shrunk with self.shrink pseudo-observations
        towards the batch's a(budgets[0]) `base` and towards the batch's increments `inc` ([K - 1]) scaled by the
        request's own 1 + a(budgets[0]) over the batch's: a request the drafter serves poorly gains fewer tokens from
        a larger tree. (Unscaled, the slowest request, which the batch's finishing time follows, was credited the
        batch's gain before any round measured its own: at batch 64 on the H200 auto ran budget 8 on 7 of 53
        rounds, 0.973x the best fixed budget's tokens/s, against 4 rounds and 0.988x scaled, in the same run.)"""
        w = self.shrink
        a0 = (S[:, :1] + w * base) / (C[:, :1] + w)
        inc = inc[None, :] * (1.0 + a0) / (1.0 + base)
        steps = np.maximum((S[:, 1:] - P[:, 1:] + w * inc) / (C[:, 1:] + w), 0.0)
        return np.concatenate([a0, a0 + np.cumsum(steps, 1)], 1)

    def estimates(self):
        """The batch's accepted draft tokens per round by budget ([K]), or None before any observation."""
        if self.C[0] <= 0:
            return None
        return self._chain(self.S, self.P, self.C)

    def times(self, batch: int, remaining=None, cost=None):
        """Predicted time to finish the batch at each budget ([K], relative), or None before any observation:
        cost(batch, n) x max over the requests still decoding of (remaining_b / (1 + a_b(n)) + LAST_ROUND).
        remaining [B] tokens left per request (None or all <= 0: one request's rate). cost: the row to use instead
        of the table's."""
        a = self.estimates()
        if a is None:
            return None
        if cost is None:
            cost = self.costs.row_of(batch, self.budgets)
        cost = np.asarray(cost, dtype=np.float64)
        if remaining is None or self.rC.shape[0] != len(remaining):
            return cost / (1.0 + a)
        rem = np.asarray(remaining, dtype=np.float64)
        live = rem > 0
        if not live.any():
            return cost / (1.0 + a)
        ab = self._chain_requests(self.rS[live], self.rP[live], self.rC[live], a[0], np.diff(a))
        return cost * (rem[live, None] / (1.0 + ab) + LAST_ROUND).max(0)

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
    1.. the accepted path's node indices after the root; with alloc_cap (rounds whose nodes are allocated over
    the batch, kdtree.integrations.allocate; alloc_cap(b) the most nodes a request takes at budget b), the
    round's tree scores follow (float32 bits, root and nodes 1..cap): the host ranks them as allocate does
    (weighted by its own generated counts, which are the round's) into the draft nodes each request would
    take at every budget (allocate.nodes_by_budget), so a round at budget n tells what every budget m <= n
    would have accepted under the allocation at m; on the device that is one copy. The loop copies `stats` to
    the host with the round and hands the copy to `observe` when it has arrived (`lag` rounds later); it
    returns whether every request is done (the host adds each request's accepted + 1 to its generated count,
    as the round did on the device).
    """

    def __init__(self, budgets, costs: CostTable, device, *, depth: int, policy=None, alloc_cap=None):
        self.budgets = tuple(sorted(budgets))
        self.costs = costs
        self.device = torch.device(device)
        self.depth = int(depth)
        # alloc_cap(budget): the most draft nodes a request takes in a round allocated over the batch
        self.alloc_caps = None if alloc_cap is None else [int(alloc_cap(b)) for b in self.budgets]
        # stats' columns after the path: with alloc_cap, the tree scores of the widest cap's round
        self.extra = max(self.alloc_caps) + 1 if self.alloc_caps is not None else 0
        self._totals = None  # with alloc_cap: each budget's nodes over the batch (B x budget), a CPU tensor
        self.policy = policy if policy is not None else BudgetPolicy(self.budgets, costs)
        self.batch, self.max_new = None, None
        self.stats = None
        self.gen = None

    def reset(self, batch: int, max_new: int):
        """A new batch (admission): each request's statistics restart; the batch's are kept while the batch size
        is unchanged (its cost row is the same)."""
        if self.batch != batch:
            self.policy = BudgetPolicy(self.budgets, self.costs)
            self.stats = torch.zeros(batch, 1 + self.depth + self.extra, dtype=torch.int32, device=self.device)
            self._totals = batch * torch.tensor(self.budgets, dtype=torch.int64)
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

    @property
    def accepted(self) -> torch.Tensor:
        """self.stats' column 0 (a view): a round that computes its accepted counts into it
        (`torch.where(..., out=auto.accepted)`) saves record's copy of them."""
        return self.stats[:, 0]

    def record(self, accepted, path, scores=None):
        """The round's numbers into self.stats (on the device, one copy each, none for `accepted` when it is
        self.accepted already). accepted [B]: the accepted draft tokens of the requests the round decoded, -1
        for the others; path [B, W]: tree_accept's path; with alloc_cap, scores [B, W] float32: the round's
        tree_build scores (trees built at the round's cap, allocated or not)."""
        L = min(path.shape[1] - 1, self.depth)
        col = self.stats[:, 0]
        if not (accepted.data_ptr() == col.data_ptr() and accepted.stride() == col.stride()):
            col.copy_(accepted)
        self.stats[:, 1:1 + L].copy_(path[:, 1:1 + L])
        if self.alloc_caps is not None:
            if scores is None:
                raise ValueError("AutoBudget.record: rounds allocated over the batch (alloc_cap) need their tree "
                                 "scores")
            w = min(scores.shape[1], self.extra)
            self.stats[:, 1 + self.depth:1 + self.depth + w].copy_(scores[:, :w].float().view(torch.int32))

    def alloc_nodes(self, row, used: int) -> np.ndarray:
        """[B, len(budgets)] the draft nodes each request takes at every budget under that budget's allocation,
        from a recorded row of a round at `used` (alloc_cap): its tree scores ranked on the host by
        kdtree.integrations.allocate's own functions, weighted by the tokens each request had left (self.gen
        before the row advances it: rows are read in order)."""
        row = np.asarray(row, dtype=np.int32).reshape(self.batch, -1)
        cap = self.alloc_caps[self.budgets.index(used)]
        if self.batch == 1:
            # A batch of one takes each budget's whole allocation, min(budget, its cap, the recorded trees' cap),
            # whatever the scores: no ranking, which was most of the host's work on a round at batch 1.
            return np.minimum(np.asarray(self.budgets), np.minimum(self.alloc_caps, cap))[None, :].astype(np.int32)
        scores = torch.from_numpy(np.ascontiguousarray(row[:, 1 + self.depth:2 + self.depth + cap]).view(np.float32))
        ranked = rank(scores, torch.from_numpy(row[:, 0] >= 0), cap, behind(torch.from_numpy(self.max_new - self.gen)))
        return nodes_by_budget(ranked, self._totals, self.alloc_caps).numpy()

    def observe(self, row, used: int, advance: bool = True, seconds: float | None = None) -> bool:
        """A round's stats as read on the host (self.stats' shape, a tensor or array), `used` the budget it ran
        with, `seconds` its steady time if known (RoundLog.pop: it joins the cost table's samples). Returns whether
        every request was done after it. advance=False: a calibration round (its state was restored): statistics
        only."""
        row = np.asarray(row).reshape(self.batch, -1)
        acc = row[:, 0].astype(np.int64)
        if seconds is not None:
            self.costs.observe(self.batch, used, seconds)
        # each budget's nodes per request: the budget itself, or what the allocation at it gives the request
        nodes = self.alloc_nodes(row, used) if self.extra else self.budgets
        return self.observe_counts(counterfactual_accepts(acc, row[:, 1:1 + self.depth], nodes), acc >= 0,
                                   used, advance, accepted=acc)

    def observe_counts(self, counts, active, used: int, advance: bool = True, accepted=None) -> bool:
        """observe's step after a row's counterfactual counts: counts [B, len(budgets)] (counterfactual_accepts:
        what each budget would have accepted, under the allocation at it for rounds allocated over the batch),
        active [B] bool, `used` the round's budget (one of self.budgets; budgets up to it are observed);
        accepted [B]: the round's accepted draft tokens (default: the counts at `used`). Returns whether every
        request is done. examples/ddtree/simulate.py replays rounds through it from a trace's counts."""
        active = np.asarray(active, dtype=bool)
        self.policy.add(counts, active, used)
        if advance:
            acc = np.asarray(counts)[:, self.budgets.index(used)] if accepted is None else np.asarray(accepted)
            self.gen[active] += acc[active] + 1
        return bool((self.gen >= self.max_new).all())

    def initialise(self, row, used: int):
        """A calibration round (state restored after), best at the largest budget: every budget's counts."""
        self.observe(row, used, advance=False)

    def rehearse(self, row, used: int):
        """The host's work on a round at `used` (the plan's estimate, a row's counts) without its effects:
        calibration bursts run it, so that their rounds cost what the decoding loop's do where the host is the
        bottleneck."""
        self.policy.times(self.batch, self.max_new - self.gen, cost=np.ones(len(self.budgets)))  # no row yet
        row = np.asarray(row).reshape(self.batch, -1)
        nodes = self.alloc_nodes(row, used) if self.extra else self.budgets
        counterfactual_accepts(row[:, 0], row[:, 1:1 + self.depth], nodes)

    def calibrate(self, run_round, restore, *, rounds: int = 5, lag: int = 2, event=None):
        """Measures every candidate budget's round at this batch into the cost table, as the decoding loop runs
        rounds: a burst at each budget through steady_round_seconds (no host synchronisation
        between them, the loop's host work rehearsed), `rounds` samples each. run_round(budget) runs one round and
        records it into self.stats; restore() puts the request state back (after every burst). First one
        untimed round per budget (an eager round's first run at a shape pays for allocations and library
        heuristics, which would stay in the table of a budget the loop never runs); then a round at the largest
        budget gives every budget's first counts, before the bursts (so they rehearse a plan with estimates); the
        rest of that budget's burst adds its later rounds' counts (statistics only)."""
        top = self.budgets[-1]
        for b in self.budgets:
            run_round(b)
            restore()
        run_round(top)
        self.initialise(self.stats.cpu().numpy(), top)
        restore()
        later = []

        def burst(b):
            secs, rows = steady_round_seconds(lambda: run_round(b), self.stats, rounds, lag=lag,
                                              host_work=lambda row: self.rehearse(row, b), event=event)
            restore()
            if b == top:
                later.extend(rows[1:])  # rows[0] is the first round again
            return secs

        self.costs.measure(self.batch, self.budgets, burst)
        for row in later:
            self.initialise(row, top)
