"""Batch-wide draft-node allocation: a round verifies a fixed number of draft nodes for the whole batch,
given to the requests whose trees' next nodes are most likely to be accepted (weighted by how far behind each
request is, for a batch that waits for its last), instead of the same budget to every request.

tree_build pops a request's nodes best first (path log-probability, non-increasing along the node index), and
its budget-m tree is the first m + 1 nodes of any larger one (kdtree.integrations.budget.prefix_tree). So the
`total` best nodes of the batch, each request's tree built at a cap, are a prefix of every request's tree: the
allocation is a node count per request, and the round's nodes are packed request after request (node_indptr)
in a fixed number of rows, B + total, which keeps a round one CUDA graph. A round costs what a uniform round of
the same rows costs (the target's rows; the attention's width is the cap's), and accepts more where the
drafter is more certain of some requests than of others. Requests that are done take nodes only when every
decoding request has its cap (a static batch runs them along; their rows are real trees over their own pages).

A batch that finishes when its last request does (a static batch: generate() to max_new tokens each) gains
little from the nodes it gives to requests far ahead, and by likelihood alone the requests the drafter serves
worst, which the batch waits for, get the fewest. `log_weight` adds a per-request value to each node's path
log-probability; `behind` makes it URGENCY x log(remaining tokens / the most remaining): the nodes go where
they shorten the batch. (Replayed over two H100 traces of the DDTree example, examples/ddtree/simulate.py:
likelihood alone 1.02-1.04x the best per-request budget's tokens/s at batches 16 and 64; with URGENCY 8
1.06-1.19x.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# A done request's node scores sort after every decoding request's (path log-probabilities and log weights
# are > -1e4).
_DONE_OFFSET = 1.0e6
# behind()'s exponent: a request with half the batch's most remaining tokens values its nodes 2**-8 as much.
URGENCY = 8.0


@dataclass
class Ranking:
    """The batch's draft nodes 1..cap in order of value, what nodes_by_budget reads."""
    scores: torch.Tensor  # [B, W] the trees' scores as ranked (with the requests' log weights)
    active: torch.Tensor  # [B] bool: the decoding requests (the others rank last)
    cap: int
    ranks: torch.Tensor   # [B, cap] int64: each node's place in the batch's order (0 = best)


@dataclass
class Allocation:
    counts: torch.Tensor    # [B] int32: 1 + draft nodes of each request (tree_accept's and kv_compact's node_counts)
    indptr: torch.Tensor    # [B + 1] int32: request b's packed rows [indptr[b], indptr[b + 1])
    row_req: torch.Tensor   # [B + total] int64: the request of each packed row
    row_node: torch.Tensor  # [B + total] int64: its node index in the request's tree (0 = root)
    ranking: Ranking | None  # what it chose from (None from kdtree.tree_allocate, which ranks without sorting)


def _ranks(scores, active, cap):
    """[B, cap] int64: each draft node's place (0 = best) among the batch's nodes 1..cap by path log-probability,
    done requests' after every decoding request's, equal scores in request order (a stable sort)."""
    key = scores[:, 1:cap + 1].float() - torch.where(active, 0.0, _DONE_OFFSET)[:, None]
    order = torch.argsort(key.reshape(-1), descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=scores.device)
    return rank.view(key.shape)


def nodes_by_budget(ranked: Ranking | Allocation, totals: torch.Tensor, caps) -> torch.Tensor:
    """[B, K] int32: the draft nodes each request takes in a round whose budget k allocates totals[k] nodes
    (B x the budget; a device tensor [K], so that the call can be part of a CUDA graph) at most caps[k] per
    request, as allocate chooses them, from the scores `ranked` ranked (a round's Allocation, or a Ranking:
    AutoBudget ranks a recorded round's scores on the host; budgets whose cap is wider than its trees' are
    counted at the trees' width, and what they give is not an allocation of theirs; budgets at the ranking's
    cap reuse it). caps non-decreasing along the budgets. A round at budget n tells, for every budget m <= n,
    which nodes m would have verified (a prefix of each request's tree), so what m would have accepted."""
    r = ranked.ranking if isinstance(ranked, Allocation) else ranked
    if r is None:
        raise ValueError("nodes_by_budget: this Allocation has no ranking (kdtree.tree_allocate's; rank() the "
                         "round's scores instead)")
    W = r.scores.shape[1]
    caps = [min(int(c), W - 1) for c in caps]
    if any(b < a for a, b in zip(caps, caps[1:])):
        raise ValueError(f"nodes_by_budget: caps must be non-decreasing, got {caps}")
    cols, k = [], 0
    while k < len(caps):
        j = k
        while j < len(caps) and caps[j] == caps[k]:
            j += 1
        place = r.ranks if caps[k] == r.cap else _ranks(r.scores, r.active, caps[k])
        cols.append((place[:, :, None] < totals[None, None, k:j]).sum(1))
        k = j
    return torch.cat(cols, 1).to(torch.int32)


def behind(remaining: torch.Tensor, urgency: float = URGENCY) -> torch.Tensor:
    """[B] float32 log weights for allocate: urgency x log(remaining / the batch's most remaining), remaining [B]
    the tokens each request has still to generate (values below 1 count as 1). 0 for the requests furthest
    behind; a request ahead values its nodes less."""
    r = remaining.float().clamp(min=1.0)
    return urgency * torch.log(r / r.max())


def rank(scores: torch.Tensor, active: torch.Tensor, cap: int, log_weight: torch.Tensor | None = None) -> Ranking:
    """The batch's draft nodes 1..cap ranked by path log-probability plus their request's log_weight (allocate's
    arguments). Alone for nodes_by_budget: AutoBudget.alloc_nodes ranks a recorded round's tree scores on the
    host, the allocation of every candidate budget."""
    B, W = scores.shape
    if not 1 <= cap < W:
        raise ValueError(f"allocate: cap must be 1..{W - 1} (the trees' width less the root), got {cap}")
    if active.shape != (B,):
        raise ValueError(f"allocate: active must be [{B}], got {tuple(active.shape)}")
    if log_weight is not None:
        if log_weight.shape != (B,):
            raise ValueError(f"allocate: log_weight must be [{B}], got {tuple(log_weight.shape)}")
        scores = scores.float() + log_weight.float()[:, None]
    return Ranking(scores, active, cap, _ranks(scores, active, cap))


def allocate(scores: torch.Tensor, active: torch.Tensor, total: int, cap: int,
             log_weight: torch.Tensor | None = None) -> Allocation:
    """The `total` draft nodes of highest path log-probability (plus log_weight) over the batch, at most `cap`
    per request.

    scores [B, W] float: tree_build's scores of trees built at budget >= cap (node 0 the root; nodes 1..cap
    valid in every request); active [B] bool: the requests still decoding (the others take nodes last);
    log_weight [B] float (optional, e.g. behind()): added to each request's scores, so that the nodes go by
    probability times the request's weight. Returns the per-request counts, the packed row map and the
    ranking (its `scores` the weighted ones). Device tensors only, no host synchronisation."""
    B, W = scores.shape
    if 1 <= cap < W and not 0 <= total <= B * cap:
        raise ValueError(f"allocate: total must be 0..{B * cap} (batch {B} x cap {cap}), got {total}")
    r = rank(scores, active, cap, log_weight)
    dev = scores.device
    counts = ((r.ranks < total).sum(1) + 1).to(torch.int32)
    indptr = torch.zeros(B + 1, dtype=torch.int32, device=dev)
    torch.cumsum(counts, 0, out=indptr[1:])
    rows = torch.arange(B + total, dtype=torch.int32, device=dev)
    row_req = torch.searchsorted(indptr[1:], rows, right=True).long()
    row_node = (rows - indptr[row_req]).long()
    return Allocation(counts, indptr, row_req, row_node, r)


def allocate_round(ops, scores: torch.Tensor, active: torch.Tensor, total: int, cap: int,
                   remaining: torch.Tensor) -> Allocation:
    """A decoding round's allocation through an ops backend (kdtree.integrations.load_ops): allocate's choice
    weighted by behind(remaining), in one kernel with kdtree's (kdtree.tree_allocate; no ranking kept) and by
    allocate itself with the torch backend's. remaining [B] int32: each request's tokens still to generate."""
    counts, indptr, row_req, row_node = ops.tree_allocate(scores, total=total, cap=cap, active=active,
                                                          remaining=remaining, urgency=URGENCY)
    return Allocation(counts, indptr, row_req, row_node, None)
