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
                    dtype=torch.bfloat16, kv_dtype=None, kv_scale=1.0, alloc="request"):
    """alloc: the speculative engine's node allocation (engine.Engine's)."""
    B = len(prompts)
    mp = max(len(p) for p in prompts)
    runs = {}
    for mode in ("ar", "spec"):
        e = _engine(models, ops, mode, B, mp, max_new, budget=budget, top_k=top_k, temperature=0.0,
                    page_size=page_size, record_margins=True, device=device, dtype=dtype, kv_dtype=kv_dtype,
                    kv_scale=kv_scale, alloc=alloc)
        runs[mode] = e.generate(prompts)
    ar, sp = runs["ar"], runs["spec"]
    report = near_tie_report(ar.tokens, ar.margins, sp, max_new, "ar_margin", [len(p) for p in prompts])
    report.update(ar_tokens=ar.tokens, spec_tokens=sp.tokens)
    return report


def near_tie_report(ref_tokens, ref_margins, sp, max_new, margin_key, prompt_lens=None, noise=None):
    """The near-tie rule over a reference decoding (tokens and top-2 margins per request) and a speculative
    one (`sp`, with margins): every divergence must sit where the reference's top-2 margin (`margin_key` in
    each request's row) is within the numeric noise, the largest |margin difference| over the positions
    where both agree. `noise`: judge by this noise instead (a run known to be right measured it; a wrong
    decoding also moves the margins where it agrees, so its own noise would excuse its divergences)."""
    measured, reqs = 0.0, []
    for b, (toks, margins) in enumerate(zip(ref_tokens, ref_margins)):
        s = sp.tokens[b]
        first = next((i for i in range(max_new) if toks[i] != s[i]), None)
        for i in range(max_new if first is None else first):
            measured = max(measured, abs(margins[i] - sp.margins[b][i]))
        row = {"request": b}
        if prompt_lens is not None:
            row["prompt_len"] = prompt_lens[b]
        row.update({"equal": first is None, "first_divergence": first,
                    margin_key: None if first is None else margins[first],
                    "spec_margin": None if first is None else sp.margins[b][first]})
        reqs.append(row)
    noise = measured if noise is None else noise
    for r in reqs:
        r["near_tie"] = None if r["equal"] else r[margin_key] <= noise
    acc = [x for row in sp.accept_lens for x in row if x >= 0]
    return {"requests": reqs, "numeric_margin_noise": noise, "measured_margin_noise": measured,
            "equal": sum(r["equal"] for r in reqs),
            "near_tie_divergences": sum(1 for r in reqs if r["near_tie"]),
            "other_divergences": sum(1 for r in reqs if r["near_tie"] is False),
            "mean_tokens_per_step": sum(a + 1 for a in acc) / max(1, len(acc))}


def tv_distance(x, y, support):
    """TV between the empirical distributions of integer samples x and y (values < support)."""
    px = torch.bincount(x, minlength=support).double() / x.numel()
    py = torch.bincount(y, minlength=support).double() / y.numel()
    return 0.5 * (px - py).abs().sum().item()


def permutation_thresholds(pairs, *, alpha=1e-3, rounds=2000, seed=0):
    """For each (x, y) pair of samples of one statistic (all pairs come from the same draws, so one
    relabeling of the draws serves them all): the (1 - alpha) quantile of TV under random
    relabelings of the pooled samples, the permutation p-value of the observed TV, and the mean TV
    under relabeling (what sampling noise alone gives for these sample sizes and this support)."""
    n, m = pairs[0][0].numel(), pairs[0][0].numel() + pairs[0][1].numel()
    pooled = []
    for x, y in pairs:
        values, inv = torch.unique(torch.cat([x, y]), return_inverse=True)  # only the values seen matter
        pooled.append((inv, values.numel()))
    gen = torch.Generator().manual_seed(seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the same relabelings either way (CPU RNG)
    pooled = [(inv.to(dev), U) for inv, U in pooled]
    tvs = [[] for _ in pairs]
    for start in range(0, rounds, 128):
        r = min(128, rounds - start)
        perm = torch.argsort(torch.rand(r, m, generator=gen).to(dev), dim=1)
        base = torch.arange(r, device=dev)[:, None]
        for k, (inv, U) in enumerate(pooled):
            lab = inv[perm] + base * U  # [r, m]: the first n are "x", the rest "y"
            cx = torch.bincount(lab[:, :n].flatten(), minlength=r * U).view(r, U).double() / n
            cy = torch.bincount(lab[:, n:].flatten(), minlength=r * U).view(r, U).double() / (m - n)
            tvs[k].append(0.5 * (cx - cy).abs().sum(1))
    out = []
    for (x, y), (inv, U), t in zip(pairs, pooled, tvs):
        t = torch.cat(t).cpu()
        inv = inv.cpu()
        observed = tv_distance(inv[:n], inv[n:], U)
        out.append({"tv": observed, "threshold": torch.quantile(t, 1 - alpha).item(),
                    "p_value": (1 + (t >= observed - 1e-12).sum().item()) / (1 + rounds),
                    "null_mean_tv": t.mean().item(), "support_seen": U})
    return out


def _sample_first(models, ops, prompt, streams, n_tokens, mode, chunk, **kw):
    out = []
    for i in range(0, len(streams), chunk):
        ids = streams[i:i + chunk]
        e = _engine(models, ops, mode, len(ids), len(prompt), n_tokens, temperature=1.0, **kw)
        out += e.generate([prompt] * len(ids), stream_ids=ids).tokens
    return torch.tensor(out, dtype=torch.int64)  # [n, n_tokens]


def sampling_tv(models, ops, prompt, *, n_samples, n_tokens=3, budget, top_k, seed=11, chunk=1024,
                page_size=64, device="cuda", dtype=torch.bfloat16, alpha=1e-3, rounds=2000, kv_dtype=None, kv_scale=1.0):
    kw = dict(budget=budget, top_k=top_k, seed=seed, page_size=page_size, device=device, dtype=dtype,
              kv_dtype=kv_dtype, kv_scale=kv_scale)
    vocab = models[2].vocab
    spec = _sample_first(models, ops, prompt, list(range(n_samples)), n_tokens, "spec", chunk, **kw)
    ar = _sample_first(models, ops, prompt, list(range(n_samples, 2 * n_samples)), n_tokens, "ar", chunk, **kw)
    # The same streams drawn autoregressively: the coupled draw should reproduce spec's tokens.
    ar_same = _sample_first(models, ops, prompt, list(range(n_samples)), n_tokens, "ar", chunk, **kw)
    pairs = [(spec[:, i], ar[:, i]) for i in range(n_tokens)]
    pairs.append((spec[:, 0] * vocab + spec[:, 1], ar[:, 0] * vocab + ar[:, 1]))
    names = [f"token{i + 1}" for i in range(n_tokens)] + ["tokens1-2 joint"]
    stats = dict(zip(names, permutation_thresholds(pairs, alpha=alpha, rounds=rounds)))
    coupled = (spec == ar_same).all(1).float().mean().item()
    chance = (spec == ar).all(1).float().mean().item()  # independent streams: agreement by chance
    return {"n_samples": n_samples, "n_tokens": n_tokens, "alpha": alpha, "stats": stats,
            "coupled_identical_fraction": coupled, "independent_identical_fraction": chance}
