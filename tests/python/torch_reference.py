"""Test-side references and random cases in torch/Python, written from the API contract
(/README.md, kdtree.h), independently of the C++ references in reference/."""

import heapq
import math

import numpy as np
import torch


def random_parents(n, gen):
    """A random tree of n nodes in topological order: parent[0] = -1, parent[i] in [0, i)."""
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ancestor_masks(parents, words):
    """Per node, int64 words with bit j set iff j is the node or one of its ancestors."""
    rows = []
    for i in range(len(parents)):
        bits = 0
        j = i
        while j >= 0:
            bits |= 1 << j
            j = parents[j]
        row = []
        for w in range(words):
            word = (bits >> (64 * w)) & ((1 << 64) - 1)
            row.append(word - (1 << 64) if word >= 1 << 63 else word)  # as a signed int64
        rows.append(row)
    return rows


def to_e4m3(x, scale):
    """x / scale as torch.float8_e4m3fn codes (round to nearest even), saturated to +-448 as an fp8 KV cache
    writer does (torch's cast alone would turn values past 448 into NaN)."""
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


def random_scale(gen):
    """A KV scale 2^e x (1 + m/8), e in [-8, -3]: N(0, 1) values / scale span most of e4m3's range."""
    e = int(torch.randint(-8, -2, (1,), generator=gen))
    m = int(torch.randint(0, 8, (1,), generator=gen))
    return math.ldexp(1.0 + m / 8.0, e)


def verify_case(*, mla, heads, kv_heads, head_dim, page, width, dtype, batch, seed, device, prefix_max=300,
                spare_pages=5, mla_3d=False, kv_dtype="as_q"):
    """Random trees (uneven node counts), uneven prefix lengths and scattered pages. kv_dtype "e4m3": the
    caches are float8_e4m3fn with random scales (case["k_scale"], case["v_scale"])."""
    gen = torch.Generator().manual_seed(seed)
    words = (width + 63) // 64
    nodes = [int(torch.randint(1, width + 1, (1,), generator=gen)) for _ in range(batch)]
    nodes[0] = width  # one full tree
    prefixes = [int(torch.randint(0, prefix_max + 1, (1,), generator=gen)) for _ in range(batch)]
    prefixes[-1] = 0  # a request with no prefix at all
    kv_lens = [p + n for p, n in zip(prefixes, nodes)]
    pages_needed = [math.ceil(l / page) for l in kv_lens]
    max_pages = max(pages_needed) + 1
    num_pages = sum(pages_needed) + spare_pages
    perm = torch.randperm(num_pages, generator=gen).tolist()
    table = torch.empty(batch, max_pages, dtype=torch.int32)
    at = 0
    for b in range(batch):
        need = pages_needed[b]
        table[b, :need] = torch.tensor(perm[at:at + need], dtype=torch.int32)
        at += need
        table[b, need:] = torch.randint(0, num_pages, (max_pages - need,), generator=gen, dtype=torch.int32)
    masks, parents_all = [], []
    for n in nodes:
        parents = random_parents(n, gen)
        parents_all.append(parents)
        masks.extend(ancestor_masks(parents, words))
    total = sum(nodes)
    dqk = 576 if mla else head_dim
    q = torch.randn(total, heads, dqk, generator=gen).to(dtype)
    if mla:
        k = torch.randn(num_pages, page, 1, 576, generator=gen).to(dtype)
        if mla_3d:
            k = k.reshape(num_pages, page, 576)
        v = None
    else:
        k = torch.randn(num_pages, page, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(num_pages, page, kv_heads, head_dim, generator=gen).to(dtype)
    k_scale = v_scale = None
    if kv_dtype == "e4m3":
        k_scale, v_scale = random_scale(gen), random_scale(gen)
        k = to_e4m3(k, k_scale)
        v = None if v is None else to_e4m3(v, v_scale)
    indptr = [0]
    for n in nodes:
        indptr.append(indptr[-1] + n)
    to = dict(device=device)
    return dict(
        k_scale=k_scale, v_scale=v_scale,
        q=q.to(**to), k_cache=k.to(**to), v_cache=None if v is None else v.to(**to), page_table=table.to(**to),
        kv_lens=torch.tensor(kv_lens, dtype=torch.int32, **to),
        node_indptr=torch.tensor(indptr, dtype=torch.int32, **to),
        tree_mask=torch.tensor(masks, dtype=torch.int64, **to).reshape(total, words),
        max_tree_nodes=width, nodes=nodes, prefixes=prefixes, mla=mla)


def verify_reference(c, sm_scale=None, q_rounding_bound=False):
    """float64 tree attention: node i of request b attends to KV positions [0, prefix_b) and prefix_b + j
    for every j with bit j of its mask set. Returns out [N, Hq, Dv] and lse [N, Hq] (natural log). e4m3 caches
    are dequantised first: value = stored x k_scale / v_scale (MLA: V = the first 512 dims x v_scale).
    q_rounding_bound: also returns, per row, how far rounding q to e4m3 can move its LSE (kdtree.h, the e4m3
    MMA path): 2^-4 x sm_scale x the largest sum_i |q_i k_i| over the row's visible tokens."""
    q = c["q"].double()
    n_total, hq, dqk = q.shape
    k_scale = c.get("k_scale") or 1.0
    v_scale = c.get("v_scale") or 1.0
    stored = c["k_cache"].double()
    page = stored.shape[1]
    stored = stored.reshape(stored.shape[0], page, -1, dqk)
    k = stored * k_scale
    v = stored[..., :512] * v_scale if c["v_cache"] is None else c["v_cache"].double() * v_scale
    hkv = k.shape[2]
    scale = 1.0 / math.sqrt(dqk) if sm_scale is None else sm_scale
    out = torch.empty(n_total, hq, v.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.empty(n_total, hq, dtype=torch.float64, device=q.device)
    bound = torch.empty(n_total, hq, dtype=torch.float64, device=q.device)
    table = c["page_table"].long()
    masks = c["tree_mask"].cpu().tolist()
    start = 0
    for b, (n, prefix) in enumerate(zip(c["nodes"], c["prefixes"])):
        length = prefix + n
        pos = torch.arange(length, device=q.device)
        phys = table[b, pos // page]
        kb = k[phys, pos % page]  # [L, Hkv, D]
        vb = v[phys, pos % page]
        group = hq // hkv
        kb = kb.repeat_interleave(group, dim=1)  # [L, Hq, D]
        vb = vb.repeat_interleave(group, dim=1)
        qb = q[start:start + n]  # [n, Hq, D]
        s = torch.einsum("nhd,lhd->nhl", qb, kb) * scale
        allowed = torch.zeros(n, length, dtype=torch.bool, device=q.device)
        allowed[:, :prefix] = True
        for i in range(n):
            bits = 0
            for w, word in enumerate(masks[start + i]):
                bits |= (word & ((1 << 64) - 1)) << (64 * w)
            for j in range(n):
                if bits >> j & 1:
                    allowed[i, prefix + j] = True
        s = s.masked_fill(~allowed[:, None, :], float("-inf"))
        lse[start:start + n] = torch.logsumexp(s, dim=-1)
        if q_rounding_bound:
            moves = torch.einsum("nhd,lhd->nhl", qb.abs(), kb.abs()) * (scale / 16)
            bound[start:start + n] = moves.masked_fill(~allowed[:, None, :], 0.0).amax(dim=-1)
        out[start:start + n] = torch.einsum("nhl,lhd->nhd", torch.softmax(s, dim=-1), vb)
        start += n
    return (out, lse, bound) if q_rounding_bound else (out, lse)


def rel_l2(x, ref):
    """||x - ref|| / ||ref|| in float64."""
    x, ref = x.double(), ref.double()
    den = torch.linalg.vector_norm(ref)
    num = torch.linalg.vector_norm(x - ref)
    return float(num / den) if float(den) > 0 else float(num)


def tree_build_reference(draft_tokens, draft_logprobs, root_tokens, prefix_lens, budget, width):
    """DDTree best-first expansion per request, in float32 like the contract: a node's score is its parent's
    plus its own log-prob; the frontier pops the highest score, then the shallower node, then the
    lexicographically smaller rank path. Popping (d, r) offers its sibling (d, r+1) and its child
    (d+1, 0)."""
    B, D, K = draft_tokens.shape
    words = (width + 63) // 64
    toks = draft_tokens.cpu().numpy()
    lps = draft_logprobs.cpu().numpy().astype(np.float32)
    roots = root_tokens.cpu().tolist()
    prefixes = prefix_lens.cpu().tolist()
    res = {name: np.full((B, width), -1, dtype=np.int32) for name in
           ("tokens", "parents", "depths", "positions", "first_child", "next_sibling")}
    res["tree_mask"] = np.zeros((B, width, words), dtype=np.uint64)
    res["node_counts"] = np.zeros(B, dtype=np.int32)
    res["scores"] = np.full((B, width), -np.inf, dtype=np.float32)
    for b in range(B):
        nodes = [dict(score=np.float32(0.0), depth=0, rank=0, parent=-1, path=())]
        heap = []

        def push(parent, depth, rank):
            score = np.float32(nodes[parent]["score"] + lps[b, depth - 1, rank])
            path = nodes[parent]["path"] + (rank,)
            heapq.heappush(heap, (-float(score), depth, path, dict(score=score, depth=depth, rank=rank,
                                                                    parent=parent, path=path)))

        push(0, 1, 0)
        while len(nodes) - 1 < budget and heap:
            c = heapq.heappop(heap)[3]
            index = len(nodes)
            nodes.append(c)
            if c["rank"] + 1 < K:
                push(c["parent"], c["depth"], c["rank"] + 1)
            if c["depth"] < D:
                push(index, c["depth"] + 1, 0)
        n = len(nodes)
        res["node_counts"][b] = n
        for i, c in enumerate(nodes):
            res["tokens"][b, i] = roots[b] if i == 0 else toks[b, c["depth"] - 1, c["rank"]]
            res["parents"][b, i] = c["parent"]
            res["depths"][b, i] = c["depth"]
            res["positions"][b, i] = prefixes[b] + c["depth"]
            res["scores"][b, i] = c["score"]
            j = i
            while j >= 0:
                res["tree_mask"][b, i, j // 64] |= np.uint64(1 << (j % 64))
                j = nodes[j]["parent"]
            kids = [j for j in range(i + 1, n) if nodes[j]["parent"] == i]
            res["first_child"][b, i] = kids[0] if kids else -1
            if i > 0:
                sibs = [j for j in range(i + 1, n) if nodes[j]["parent"] == c["parent"]]
                res["next_sibling"][b, i] = sibs[0] if sibs else -1
    res["tree_mask"] = res["tree_mask"].view(np.int64)
    return res


def tree_accept_reference(tokens, parents, node_counts, targets_per_request):
    """Walk from the root: while some child (lowest index first) carries the target's token at the current
    node, step to it. targets_per_request[b][i] is the target token at node i of request b."""
    tokens, parents = tokens.cpu().tolist(), parents.cpu().tolist()
    counts = node_counts.cpu().tolist()
    B, W = len(tokens), len(tokens[0])
    path = [[-1] * W for _ in range(B)]
    lens, bonus = [], []
    for b in range(B):
        cur, p = 0, [0]
        while True:
            want = targets_per_request[b][cur]
            nxt = next((j for j in range(cur + 1, counts[b]) if parents[b][j] == cur and tokens[b][j] == want), -1)
            if nxt < 0:
                break
            p.append(nxt)
            cur = nxt
        path[b][:len(p)] = p
        lens.append(len(p) - 1)
        bonus.append(targets_per_request[b][cur])
    return path, lens, bonus


def kv_compact_reference(caches, page_table, kv_lens, node_counts, accepted_path, accept_lens):
    """In place on copies: for each request, path entry j (node n_j) moves from KV position prefix + n_j to
    prefix + j (prefix = kv_len - node_count); all sources are read before any write."""
    page = caches[0].shape[1]
    table = page_table.cpu().tolist()
    out = [c.clone() for c in caches]
    for b, (kv_len, n, length) in enumerate(zip(kv_lens.tolist(), node_counts.tolist(), accept_lens.tolist())):
        prefix = kv_len - n
        path = accepted_path[b].tolist()[:length + 1]
        for layer in range(len(caches)):
            src = [caches[layer][table[b][(prefix + node) // page], (prefix + node) % page].clone() for node in path]
            for j, row in enumerate(src):
                out[layer][table[b][(prefix + j) // page], (prefix + j) % page] = row
    return out
