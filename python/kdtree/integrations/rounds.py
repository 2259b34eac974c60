"""The request-state bookkeeping of a DDTree round, shared by kdtree.integrations.transformers.DDTreeDecoder and
the DDTree example's Engine (examples/ddtree/engine.py). Device tensors only, no host synchronisation, so a
round can be a CUDA graph.

The state object holds, per request b (batch B): `kv_lens[b]` tokens in the cache, `root[b]` the newest token
(not yet in the cache), `h_last[b]` the target's final hidden state that predicted it, `gen[b]` tokens
generated so far, `out` [B, out_cols] the generated tokens (the last column takes the writes of finished
requests), `out_margin` (the target's top-2 logit margin at each emitted token, when `record_margins`) and
`stream` [B] int64, the sampling RNG stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def row_offsets(stream, positions, batch):
    """sample_tokens' RNG row offset of the token predicted at each position: (stream << 32) + position + 1."""
    return (stream[:, None] << 32) + positions.view(batch, -1).long() + 1


def packed_row_offsets(stream, alloc, positions):
    """row_offsets of a round allocated over the batch (kdtree.integrations.allocate.Allocation): one per packed
    row, from its request's stream and its node's position."""
    req = alloc.row_req
    return row_offsets(stream[req], positions, req.numel()).flatten()


@dataclass
class PackedNodes:
    """The target's rows of a round allocated over the batch, packed request after request (alloc.indptr)."""
    tokens: torch.Tensor     # [rows] each row's draft token
    positions: torch.Tensor  # [rows] its position in the sequence
    mask: torch.Tensor       # [rows, ceil(W/64)] its tree-mask words
    req: torch.Tensor        # [rows] int64 its request
    cache_pos: torch.Tensor  # [rows] int64 where its KV row goes in the request's cache (the request's length + node)
    kv_total: torch.Tensor   # [B] each request's KV length with its allocated nodes


def packed_nodes(tree, alloc, kv_lens):
    """tree_build's trees gathered into the rows `alloc` (kdtree.integrations.allocate.Allocation) chose."""
    r, i = alloc.row_req, alloc.row_node
    return PackedNodes(tree.tokens[r, i], tree.positions[r, i], tree.tree_mask[r, i], r, kv_lens.long()[r] + i,
                       kv_lens + alloc.counts)


def accept_allocated(ops, tree, alloc, target_tokens):
    """tree_accept over a round allocated over the batch: each request's allocated nodes, packed by node_indptr."""
    return ops.tree_accept(tree.tokens, tree.parents, alloc.counts, target_tokens, node_indptr=alloc.indptr)


def margins(logits):
    """The top-2 logit margin of each row."""
    top2 = logits.float().topk(2, dim=-1).values
    return top2[:, 0] - top2[:, 1]


def _pad(x, cols):
    return x if x.shape[1] >= cols else torch.cat([x, x.new_zeros(x.shape[0], cols - x.shape[1])], 1)


def commit_tree(st, tokens, path, acc, bonus, active, h, logits, depth, indptr=None):
    """After tree_accept: request b (if active) emits its accepted draft tokens tokens[b, path[b, 1..acc]] and
    the bonus token, its KV length and count grow by acc + 1, and its root and hidden state become the bonus
    and the last accepted node's. tokens/path [B, W] (a path is at most depth + 1 nodes), acc/bonus [B],
    h [rows, d] and logits [rows, V] of the packed nodes: request b's node i at row indptr[b] + i (indptr
    [B + 1]; None: N = rows / B nodes each, b * N + i)."""
    B = acc.shape[0]
    base = (torch.arange(B, device=acc.device) * (h.shape[0] // B) if indptr is None else indptr[:-1].long())
    J = depth + 1  # at most D accepted draft tokens + the bonus
    j = torch.arange(J, device=acc.device)[None, :]
    nxt = _pad(path[:, 1:J + 1].clamp(min=0).long(), J)
    vals = torch.where(j < acc[:, None], tokens.gather(1, nxt), bonus[:, None])
    keep = (j <= acc[:, None]) & active[:, None]
    cols = torch.where(keep, st.gen[:, None].long() + j, st.out_cols - 1)
    st.out.scatter_(1, cols, vals)
    if st.record_margins:  # the margin at the node that produced each emitted token
        node = _pad(path[:, :J].clamp(min=0).long(), J)  # a tree narrower than D + 1 (W = 16, D = 16)
        st.out_margin.scatter_(1, cols, margins(logits)[base[:, None] + node])
    last = path.gather(1, acc[:, None].long()).long()[:, 0]  # [B] the last accepted node
    h_new = h[base + last]
    st.h_last.copy_(torch.where(active[:, None], h_new, st.h_last))
    st.root.copy_(torch.where(active, bonus, st.root))
    st.kv_lens.copy_(torch.where(active, st.kv_lens + acc + 1, st.kv_lens))
    st.gen.copy_(torch.where(active, st.gen + acc + 1, st.gen))


def commit_token(st, token, active, logits):
    """After a one-token (autoregressive) round: request b (if active) emits token[b]."""
    cols = torch.where(active, st.gen.long(), st.out_cols - 1)[:, None]
    st.out.scatter_(1, cols, token[:, None])
    if st.record_margins:
        st.out_margin.scatter_(1, cols, margins(logits)[:, None])
    st.root.copy_(torch.where(active, token, st.root))
    st.kv_lens.copy_(torch.where(active, st.kv_lens + 1, st.kv_lens))
    st.gen.copy_(torch.where(active, st.gen + 1, st.gen))
