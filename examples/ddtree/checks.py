"""The correctness measurements the script prints and the tests assert.

greedy_equality: speculative vs autoregressive greedy decoding, token for token. A divergence is
reported with the target's top-2 logit margin there. It counts as a near-tie (attributable to
bf16 numerics) when that margin is no larger than the numeric disagreement measured in the same
run: the largest |margin_ar - margin_spec| over all positions where both runs agree (the two runs
compute the same logits with different batch shapes, so this is how far their rounding differs).

sampling_tv: the empirical distributions of the first generated tokens under speculative and
autoregressive sampling at temperature 1, from disjoint sets of RNG streams (independent samples).
The threshold for their total-variation distance is computed by a permutation test: under "same
distribution" the two labels are exchangeable, so the observed TV is compared with the TVs of
random relabelings of the pooled samples (alpha = 0.001 per statistic).
"""
from __future__ import annotations

import torch

from .engine import Engine


def _engine(models, ops, mode, B, prompts_max, max_new, **kw):
    target, drafter, cfg = models
    return Engine(target, drafter, cfg, ops, mode=mode, batch_size=B, max_prompt=prompts_max, max_new=max_new, **kw)


def greedy_equality(models, ops, prompts, *, max_new, budget, top_k, page_size=64, device="cuda",
                    dtype=torch.bfloat16):
    B = len(prompts)
    mp = max(len(p) for p in prompts)
    runs = {}
    for mode in ("ar", "spec"):
        e = _engine(models, ops, mode, B, mp, max_new, budget=budget, top_k=top_k, temperature=0.0,
                    page_size=page_size, record_margins=True, device=device, dtype=dtype)
        runs[mode] = e.generate(prompts)
    ar, sp = runs["ar"], runs["spec"]
    noise = 0.0
    reqs = []
    for b in range(B):
        a, s = ar.tokens[b], sp.tokens[b]
        first = next((i for i in range(max_new) if a[i] != s[i]), None)
        agree = max_new if first is None else first
        for i in range(agree):
            noise = max(noise, abs(ar.margins[b][i] - sp.margins[b][i]))
        reqs.append({"request": b, "prompt_len": len(prompts[b]), "equal": first is None, "first_divergence": first,
                     "ar_margin": None if first is None else ar.margins[b][first],
                     "spec_margin": None if first is None else sp.margins[b][first]})
    for r in reqs:
        r["near_tie"] = None if r["equal"] else r["ar_margin"] <= noise
    acc = [x for row in sp.accept_lens for x in row if x >= 0]
    return {"requests": reqs, "numeric_margin_noise": noise, "equal": sum(r["equal"] for r in reqs),
            "near_tie_divergences": sum(1 for r in reqs if r["near_tie"]),
            "other_divergences": sum(1 for r in reqs if r["near_tie"] is False),
            "mean_tokens_per_step": sum(a + 1 for a in acc) / max(1, len(acc)),
            "ar_tokens": ar.tokens, "spec_tokens": sp.tokens}


def tv_distance(x, y, support):
    """TV between the empirical distributions of integer samples x and y (values < support)."""
    px = torch.bincount(x, minlength=support).double() / x.numel()
    py = torch.bincount(y, minlength=support).double() / y.numel()
    return 0.5 * (px - py).abs().sum().item()


def permutation_threshold(x, y, support, *, alpha=1e-3, rounds=2000, seed=0):
    """The (1 - alpha) quantile of TV under random relabelings of the pooled samples, and the
    permutation p-value of the observed TV."""
    pooled = torch.cat([x, y])
    n = x.numel()
    gen = torch.Generator().manual_seed(seed)
    observed = tv_distance(x, y, support)
    tvs = torch.empty(rounds, dtype=torch.float64)
    for r in range(rounds):
        perm = torch.randperm(pooled.numel(), generator=gen)
        tvs[r] = tv_distance(pooled[perm[:n]], pooled[perm[n:]], support)
    threshold = torch.quantile(tvs, 1 - alpha).item()
    p_value = (1 + (tvs >= observed).sum().item()) / (1 + rounds)
    return threshold, p_value, tvs.mean().item()


def _sample_first(models, ops, prompt, streams, n_tokens, mode, chunk, **kw):
    out = []
    for i in range(0, len(streams), chunk):
        ids = streams[i:i + chunk]
        e = _engine(models, ops, mode, len(ids), len(prompt), n_tokens, temperature=1.0, **kw)
        out += e.generate([prompt] * len(ids), stream_ids=ids).tokens
    return torch.tensor(out, dtype=torch.int64)  # [n, n_tokens]


def sampling_tv(models, ops, prompt, *, n_samples, n_tokens=3, budget, top_k, seed=11, chunk=1024,
                page_size=64, device="cuda", dtype=torch.bfloat16, alpha=1e-3, rounds=2000):
    kw = dict(budget=budget, top_k=top_k, seed=seed, page_size=page_size, device=device, dtype=dtype)
    vocab = models[2].vocab
    spec = _sample_first(models, ops, prompt, list(range(n_samples)), n_tokens, "spec", chunk, **kw)
    ar = _sample_first(models, ops, prompt, list(range(n_samples, 2 * n_samples)), n_tokens, "ar", chunk, **kw)
    # The same streams drawn autoregressively: the coupled draw should reproduce spec's tokens.
    ar_same = _sample_first(models, ops, prompt, list(range(n_samples)), n_tokens, "ar", chunk, **kw)
    stats = {}
    cats = {f"token{i + 1}": (lambda t, i=i: t[:, i], vocab) for i in range(n_tokens)}
    cats["tokens1-2 joint"] = (lambda t: t[:, 0] * vocab + t[:, 1], vocab * vocab)
    for name, (f, support) in cats.items():
        x, y = f(spec), f(ar)
        thr, p, mean_null = permutation_threshold(x, y, support, alpha=alpha, rounds=rounds)
        stats[name] = {"tv": tv_distance(x, y, support), "threshold": thr, "p_value": p,
                       "null_mean_tv": mean_null, "support_seen": int(torch.unique(torch.cat([x, y])).numel())}
    coupled = (spec == ar_same).all(1).float().mean().item()
    return {"n_samples": n_samples, "n_tokens": n_tokens, "alpha": alpha, "stats": stats,
            "coupled_identical_fraction": coupled}
