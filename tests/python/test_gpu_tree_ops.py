"""GPU: kdtree.tree_build, kdtree.tree_accept and kdtree.tree_allocate against Python references (random drafts,
random targets; tree_allocate against kdtree.integrations.allocate)."""

import numpy as np
import pytest
import torch

import kdtree
import torch_reference as R

pytestmark = pytest.mark.gpu


def random_draft(batch, depth, top_k, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, depth, vocab, generator=gen) * 3
    lp, tok = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)  # descending along K
    lp = torch.minimum(lp, torch.tensor(-1e-6))  # strictly negative: no +0/-0 score ties
    roots = torch.randint(0, vocab, (batch,), generator=gen, dtype=torch.int32)
    prefixes = torch.randint(0, 5000, (batch,), generator=gen, dtype=torch.int32)
    return tok.int().cuda(), lp.float().cuda(), roots.cuda(), prefixes.cuda()


# (batch, depth, top_k, budget, width, vocab)
BUILD_CASES = [(4, 6, 8, 15, 16, 1000), (3, 16, 4, 31, 32, 50), (5, 8, 10, 63, 64, 32000),
               (2, 12, 16, 127, 128, 200), (3, 1, 64, 20, 32, 500), (1, 16, 1, 10, 16, 10), (6, 5, 3, 7, 64, 100)]


@pytest.mark.parametrize("case", BUILD_CASES,
                         ids=[f"B={b},D={d},K={k},budget={n},W={w}" for b, d, k, n, w, _ in BUILD_CASES])
def test_tree_build_matches_reference(case, record_error):
    batch, depth, top_k, budget, width, vocab = case
    draft = random_draft(batch, depth, top_k, vocab, seed=sum(case))
    r = kdtree.tree_build(*draft, budget=budget, max_tree_nodes=width)
    ref = R.tree_build_reference(*draft, budget, width)
    counts = r.node_counts.cpu().numpy()
    np.testing.assert_array_equal(counts, ref["node_counts"])
    for name in ("tokens", "parents", "depths", "positions", "first_child", "next_sibling", "tree_mask"):
        np.testing.assert_array_equal(getattr(r, name).cpu().numpy(), ref[name], err_msg=name)
    scores = r.scores.cpu().numpy()
    worst = 0.0
    for b in range(batch):
        n = counts[b]
        got, want = scores[b, :n], ref["scores"][b, :n]
        worst = max(worst, float(np.max(np.abs(got - want) / np.maximum(1.0, np.abs(want)))))
    record_error("tree_build (scores)", f"B={batch},D={depth},K={top_k},W={width}", worst)
    assert worst <= 1e-6


def _targets_following_tree(tokens, parents, counts, vocab, follow, seed):
    """Per request and node, the target's token: with probability `follow` one of the node's children's
    tokens (the walk goes on), else a random token (it usually stops)."""
    gen = np.random.default_rng(seed)
    tokens, parents, counts = tokens.cpu().numpy(), parents.cpu().numpy(), counts.cpu().numpy()
    out = np.zeros_like(tokens)
    for b in range(tokens.shape[0]):
        for i in range(counts[b]):
            kids = [j for j in range(i + 1, counts[b]) if parents[b, j] == i]
            out[b, i] = tokens[b, gen.choice(kids)] if kids and gen.random() < follow else gen.integers(0, vocab)
    return out


@pytest.mark.parametrize("width,follow,packed", [(16, 0.9, False), (32, 0.6, True), (64, 1.0, False),
                                                 (128, 0.8, True), (64, 0.0, False)],
                         ids=["W=16,follow=0.9,padded", "W=32,follow=0.6,packed", "W=64,follow=1.0,padded",
                              "W=128,follow=0.8,packed", "W=64,follow=0,padded"])
def test_tree_accept_matches_reference(width, follow, packed):
    batch, vocab = 5, 6  # a small vocabulary: siblings share tokens, so the lowest-index rule matters
    draft = random_draft(batch, 8, 6, vocab, seed=width)
    tree = kdtree.tree_build(*draft, budget=width - 1, max_tree_nodes=width)
    targets = _targets_following_tree(tree.tokens, tree.parents, tree.node_counts, vocab, follow, seed=width)
    counts = tree.node_counts.cpu().tolist()
    per_request = [targets[b, :counts[b]].tolist() for b in range(batch)]
    if packed:
        indptr = torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32, device="cuda")
        flat = torch.tensor(np.concatenate(per_request), dtype=torch.int32, device="cuda")
        path, lens, bonus = kdtree.tree_accept(tree.tokens, tree.parents, tree.node_counts, flat, node_indptr=indptr)
    else:
        path, lens, bonus = kdtree.tree_accept(tree.tokens, tree.parents, tree.node_counts,
                                               torch.tensor(targets, device="cuda"))
    ref_path, ref_lens, ref_bonus = R.tree_accept_reference(tree.tokens, tree.parents, tree.node_counts, per_request)
    assert path.cpu().tolist() == ref_path
    assert lens.cpu().tolist() == ref_lens
    assert bonus.cpu().tolist() == ref_bonus
    if follow == 1.0:
        assert min(ref_lens) >= 1  # the walk really went down the trees


# (batch, depth, top_k, width, cap, total per request, ties)
ALLOCATE_CASES = [(1, 8, 4, 16, 15, 7, False), (7, 6, 8, 16, 15, 3, True), (64, 16, 8, 64, 63, 4, False),
                  (64, 16, 8, 128, 127, 6, True), (300, 5, 4, 32, 20, 2, False), (9, 12, 6, 128, 100, 100, False)]


@pytest.mark.parametrize("case", ALLOCATE_CASES,
                         ids=[f"tree_allocate[W={w},B={b}] cap={c},total={t}x{b}{',ties' if ties else ''}"
                              for b, _, _, w, c, t, ties in ALLOCATE_CASES])
def test_tree_allocate_is_allocates_choice(case):
    """kdtree.tree_allocate (one kernel, binary searches over the sorted trees) against
    kdtree.integrations.allocate (a stable sort in torch), on the same GPU: tree_build's scores (or coarsened
    ones, many equal across requests), requests not decoding, the remaining-tokens weight; exactly equal."""
    from kdtree.integrations import torch_ops
    batch, depth, top_k, width, cap, per, ties = case
    tree = kdtree.tree_build(*random_draft(batch, depth, top_k, 1000, seed=sum(case)), budget=cap, max_tree_nodes=width)
    scores = tree.scores
    if ties:
        scores = (scores * 2).round() / 2
    g = torch.Generator().manual_seed(batch * width)
    active = (torch.rand(batch, generator=g) > 0.2).cuda()
    remaining = torch.randint(-2, 300, (batch,), generator=g, dtype=torch.int32).cuda()
    total = min(per * batch, batch * cap)
    for kw in (dict(), dict(active=active), dict(active=active, remaining=remaining, urgency=8.0),
               dict(remaining=remaining, urgency=0.0)):
        for t in (total, 0, batch * cap):
            got = kdtree.tree_allocate(scores, total=t, cap=cap, **kw)
            want = torch_ops.tree_allocate(scores, total=t, cap=cap, **kw)
            for name, x, y in zip(("node_counts", "node_indptr", "row_req", "row_node"), got, want):
                assert torch.equal(x, y), (name, sorted(kw), t)


def test_tree_allocate_in_a_cuda_graph():
    """Captured once, replayed over new scores and weights: each replay is the allocation of its inputs."""
    from kdtree.integrations import torch_ops
    B, W, cap, total = 16, 32, 31, 16 * 5
    tree = kdtree.tree_build(*random_draft(B, 10, 6, 500, seed=1), budget=cap, max_tree_nodes=W)
    scores, remaining = tree.scores.clone(), torch.full((B,), 64, dtype=torch.int32, device="cuda")
    active = torch.ones(B, dtype=torch.bool, device="cuda")
    kdtree.tree_allocate(scores, total=total, cap=cap, active=active, remaining=remaining, urgency=8.0)  # warm
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kdtree.tree_allocate(scores, total=total, cap=cap, active=active, remaining=remaining, urgency=8.0)
    for seed in range(3):
        t = kdtree.tree_build(*random_draft(B, 10, 6, 500, seed=seed + 2), budget=cap, max_tree_nodes=W)
        scores.copy_(t.scores)
        remaining.copy_(torch.randint(0, 128, (B,), dtype=torch.int32))
        active.copy_(torch.arange(B) % 5 != seed)
        for o in out:
            o.fill_(-7)  # poison: the replay must write every output
        graph.replay()
        want = torch_ops.tree_allocate(scores, total=total, cap=cap, active=active, remaining=remaining, urgency=8.0)
        for x, y in zip(out, want):
            assert torch.equal(x, y)
