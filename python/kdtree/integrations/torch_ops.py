"""Plain-torch implementations of kdtree's six operations (the `backend="torch"` path of the DDTree
example and of kdtree.integrations.transformers).

They follow the semantics of kdtree.h and the README (same argument names, layouts and
outputs as the `kdtree` Python package) but are written independently and for clarity, not
speed: tree_build is a literal best-first heap per request, tree_accept and kv_compact walk the
paths on the host. They may synchronise with the device, so only the kdtree backend is captured
in CUDA graphs. sample_tokens reproduces kdtree's counter-based Gumbel-max RNG, so a seed and
row offsets draw the same tokens on both backends (up to last-ulp differences of log).
"""
from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
import torch

import kdtree

__all__ = ["TreeBuildResult", "gumbel_noise", "kv_compact", "sample_tokens", "tree_accept", "tree_allocate",
           "tree_build", "verify_attention"]


class TreeBuildResult(NamedTuple):
    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    positions: torch.Tensor
    tree_mask: torch.Tensor
    first_child: torch.Tensor
    next_sibling: torch.Tensor
    node_counts: torch.Tensor
    scores: torch.Tensor


# ----------------------------------------------------------------------------- verify_attention

def verify_attention(q, k_cache, page_table, kv_lens, node_indptr, tree_mask, *, max_tree_nodes,
                     v_cache=None, sm_scale=None, max_kv_len=None, return_lse=False, k_scale=None, v_scale=None):
    """Tree attention over a paged cache, float32 math, output in q's dtype.

    MLA: k_cache [P, page, 1, 576] or [P, page, 576], v_cache None (V = first 512 dims of the row).
    Node i of request b sits at position kv_len[b] - n_b + i and sees the prefix plus the nodes
    whose bit is set in its tree_mask row.
    """
    total, hq, dqk = q.shape
    kc = k_cache if k_cache.dim() == 4 else k_cache.unsqueeze(2)
    _, page, hkv, _ = kc.shape
    if v_cache is None:
        dv = 512 if dqk == 576 else dqk
        vc = kc[..., :dv]
    else:
        vc = v_cache if v_cache.dim() == 4 else v_cache.unsqueeze(2)
        dv = vc.shape[-1]
    if kc.element_size() == 1:  # e4m3 caches: dequantised up front (value = code x scale)
        vc = vc.float() * (1.0 if v_scale is None else v_scale)
        kc = kc.float() * (1.0 if k_scale is None else k_scale)
    if sm_scale is None:
        sm_scale = 1.0 / dqk ** 0.5
    group = hq // hkv
    indptr = node_indptr.tolist()
    lens = kv_lens.tolist()
    out = torch.empty(total, hq, dv, dtype=q.dtype, device=q.device)
    lse = torch.empty(total, hq, dtype=torch.float32, device=q.device)
    for b in range(len(lens)):
        r0, r1 = indptr[b], indptr[b + 1]
        n = r1 - r0
        if n == 0:
            continue
        if n > max_tree_nodes or lens[b] < n:
            raise ValueError(f"verify_attention(torch): request {b} has {n} nodes, kv_len {lens[b]}")
        L = lens[b]
        prefix = L - n
        pages = page_table[b, : (L + page - 1) // page].long()
        k = kc[pages].reshape(-1, hkv, kc.shape[-1])[:L].float()  # [L, hkv, dqk]
        v = vc[pages].reshape(-1, hkv, dv)[:L].float()
        qb = q[r0:r1].float().view(n, hkv, group, dqk)
        s = torch.einsum("nkgd,lkd->nkgl", qb, k) * sm_scale
        # Visibility: every prefix position, and the tree nodes named by the mask bits.
        words = tree_mask[r0:r1]  # [n, ceil(W/64)] int64
        j = torch.arange(n, device=q.device)
        bits = (words[:, j // 64] >> (j % 64)) & 1  # [n, n]
        visible = torch.ones(n, L, dtype=torch.bool, device=q.device)
        visible[:, prefix:] = bits.bool()
        s = s.masked_fill(~visible[:, None, None, :], float("-inf"))
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m)
        denom = p.sum(-1, keepdim=True)
        o = torch.einsum("nkgl,lkd->nkgd", p / denom, v)
        out[r0:r1] = o.reshape(n, hq, dv).to(q.dtype)
        lse[r0:r1] = (m + denom.log()).reshape(n, hq)
    return (out, lse) if return_lse else out


# ----------------------------------------------------------------------------- tree_build

def tree_build(draft_tokens, draft_logprobs, root_tokens, prefix_lens, *, budget, max_tree_nodes):
    """DDTree best-first expansion per request with a host heap.

    Candidate (depth d, rank r under a parent) scores parent + logprob[d-1, r] in float32. Pop
    order: higher score, then smaller depth, then the lexicographically smaller rank path. A popped
    node pushes its next sibling (rank + 1) and its first child (depth + 1, rank 0).
    """
    B, D, K = draft_tokens.shape
    W = max_tree_nodes
    widths = kdtree.supported_shapes().widths  # the widths libkdtree generates: the reference takes the same
    if W not in widths:
        raise ValueError(f"tree_build: max_tree_nodes must be one of {', '.join(map(str, widths))}, got {W}")
    if not 1 <= budget <= W - 1:
        raise ValueError(f"tree_build: budget must be 1..{W - 1} for max_tree_nodes {W}, got {budget}")
    dev = draft_tokens.device
    lp_all = draft_logprobs.detach().to(torch.float32).cpu().numpy()
    tok_all = draft_tokens.cpu().numpy()
    roots = root_tokens.cpu().tolist()
    prefixes = prefix_lens.cpu().tolist()
    MW = (W + 63) // 64
    tokens = np.full((B, W), -1, np.int32)
    parents = np.full((B, W), -1, np.int32)
    depths = np.full((B, W), -1, np.int32)
    positions = np.full((B, W), -1, np.int32)
    first_child = np.full((B, W), -1, np.int32)
    next_sibling = np.full((B, W), -1, np.int32)
    scores = np.full((B, W), -np.inf, np.float32)
    mask = np.zeros((B, W, MW), np.uint64)
    counts = np.zeros(B, np.int32)
    for b in range(B):
        lp = lp_all[b]
        # node: (score, depth, rank, parent index, rank path)
        nodes = [(np.float32(0.0), 0, 0, -1, ())]
        heap = []

        def push(parent, depth, rank):
            score = np.float32(nodes[parent][0] + lp[depth - 1, rank])
            path = nodes[parent][4] + (rank,)
            heapq.heappush(heap, (-score, depth, path, parent, rank, score))

        push(0, 1, 0)
        while len(nodes) - 1 < budget and heap:
            _, depth, path, parent, rank, score = heapq.heappop(heap)
            nodes.append((score, depth, rank, parent, path))
            index = len(nodes) - 1
            if rank + 1 < K:
                push(parent, depth, rank + 1)
            if depth < D:
                push(index, depth + 1, 0)
        n = len(nodes)
        counts[b] = n
        for i, (score, depth, rank, parent, _) in enumerate(nodes):
            tokens[b, i] = roots[b] if i == 0 else tok_all[b, depth - 1, rank]
            parents[b, i] = parent
            depths[b, i] = depth
            positions[b, i] = prefixes[b] + depth
            scores[b, i] = score
            if i > 0:
                mask[b, i] = mask[b, parent]
                if first_child[b, parent] < 0:
                    first_child[b, parent] = i
                else:  # the previous child of the same parent links to this one
                    sib = first_child[b, parent]
                    while next_sibling[b, sib] >= 0:
                        sib = next_sibling[b, sib]
                    next_sibling[b, sib] = i
            mask[b, i, i // 64] |= np.uint64(1) << np.uint64(i % 64)

    def t(a):
        return torch.from_numpy(a).to(dev)

    return TreeBuildResult(t(tokens), t(parents), t(depths), t(positions), t(mask.view(np.int64)),
                           t(first_child), t(next_sibling), t(counts), t(scores))


# ----------------------------------------------------------------------------- tree_accept

def tree_accept(tokens, parents, node_counts, target_tokens, *, node_indptr=None):
    """From the root, follow the child whose token is the target's token at the current node."""
    B, W = tokens.shape
    tok = tokens.cpu().tolist()
    par = parents.cpu().tolist()
    counts = node_counts.cpu().tolist()
    tgt = target_tokens.cpu().tolist()
    ptr = node_indptr.cpu().tolist() if node_indptr is not None else None
    path = np.full((B, W), -1, np.int32)
    accept = np.zeros(B, np.int32)
    bonus = np.zeros(B, np.int32)
    for b in range(B):
        n = counts[b]
        target = (lambda i: tgt[ptr[b] + i]) if ptr is not None else (lambda i: tgt[b][i])
        cur, length = 0, 1
        path[b, 0] = 0
        while True:
            nxt = next((j for j in range(cur + 1, n) if par[b][j] == cur and tok[b][j] == target(cur)), -1)
            if nxt < 0:
                break
            path[b, length] = nxt
            length += 1
            cur = nxt
        accept[b] = length - 1
        bonus[b] = target(cur)
    dev = tokens.device
    return torch.from_numpy(path).to(dev), torch.from_numpy(accept).to(dev), torch.from_numpy(bonus).to(dev)


# ----------------------------------------------------------------------------- tree_allocate

def tree_allocate(scores, *, total, cap, active=None, remaining=None, urgency=0.0):
    """kdtree.integrations.allocate.allocate (a stable sort of the batch's weighted node scores), with
    kdtree.tree_allocate's arguments and outputs."""
    from .allocate import allocate, behind
    if active is None:
        active = torch.ones(scores.shape[0], dtype=torch.bool, device=scores.device)
    a = allocate(scores, active, total, cap, None if remaining is None else behind(remaining, urgency))
    return a.counts, a.indptr, a.row_req, a.row_node


# ----------------------------------------------------------------------------- sample_tokens

_M64 = (1 << 64) - 1


def _signed(c):
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(z, k):
    """Logical right shift of int64 values holding uint64 bits."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _mix64(z):
    z = (z ^ _shr(z, 30)) * _signed(0xBF58476D1CE4E5B9)
    z = (z ^ _shr(z, 27)) * _signed(0x94D049BB133111EB)
    return z ^ _shr(z, 31)


def _fmix32(h):
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def gumbel_noise(seed, offsets, vocab):
    """kdtree's noise: g = -log(-log(u)), u from hash(mix64(mix64(seed) + offset), token)."""
    dev = offsets.device
    s = _mix64(torch.tensor([_signed(seed & _M64)], dtype=torch.int64, device=dev))
    key = _mix64(s + offsets.to(torch.int64))  # [N]
    k0 = (key & 0xFFFFFFFF)[:, None]
    k1 = _shr(key, 32)[:, None]
    t = torch.arange(vocab, dtype=torch.int64, device=dev)[None, :]
    h = _fmix32(_fmix32(t ^ k0) ^ k1)
    u = (2 * (h >> 8) + 1).to(torch.float32) * 2.98023223876953125e-8
    u = torch.clamp(u, max=0.99999994039535522)
    return -torch.log(-torch.log(u))


def sample_tokens(logits, *, temperature=0.0, seed=0, row_offsets=None):
    """Greedy argmax (lowest index wins ties) for temperature <= 0, else Gumbel-max sampling."""
    x = logits.float()
    x = torch.where(torch.isnan(x), torch.full_like(x, float("-inf")), x)
    if temperature > 0 and np.isfinite(np.float32(1.0) / np.float32(temperature)):
        if row_offsets is None:
            row_offsets = torch.arange(x.shape[0], device=x.device)
        inv_t = float(np.float32(1.0) / np.float32(temperature))
        x = x * inv_t + gumbel_noise(seed, row_offsets, x.shape[1])
    # torch.argmax returns the first maximal index
    return torch.argmax(x, dim=1).to(torch.int32)


# ----------------------------------------------------------------------------- kv_compact

def kv_compact(k_caches, page_table, kv_lens, node_counts, accepted_path, accept_lens, *, v_caches=None):
    """Moves path entry j (node n_j) from position prefix + n_j to prefix + j, every layer, in place."""
    caches = list(k_caches) if isinstance(k_caches, (list, tuple)) else [k_caches[i] for i in range(k_caches.shape[0])]
    if v_caches is not None:
        caches += list(v_caches) if isinstance(v_caches, (list, tuple)) else [v_caches[i] for i in range(v_caches.shape[0])]
    page = caches[0].shape[1]
    lens = kv_lens.cpu().tolist()
    counts = node_counts.cpu().tolist()
    paths = accepted_path.cpu().tolist()
    acc = accept_lens.cpu().tolist()
    src_rows, dst_rows = [], []
    for b in range(len(lens)):
        prefix = lens[b] - counts[b]
        for j in range(acc[b] + 1):
            n = paths[b][j]
            if n == j:
                continue
            for pos, rows in ((prefix + n, src_rows), (prefix + j, dst_rows)):
                rows.append(int(page_table[b, pos // page]) * page + pos % page)
    if not src_rows:
        return
    src = torch.tensor(src_rows, device=caches[0].device)
    dst = torch.tensor(dst_rows, device=caches[0].device)
    for c in caches:
        if c.element_size() == 1:
            c = c.view(torch.uint8)  # e4m3 rows move as bytes
        flat = c.view(-1, *c.shape[2:])
        rows = flat[src].clone()  # read every source before any write: a destination may be a source
        flat[dst] = rows
