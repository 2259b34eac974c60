"""DDTree speculative decoding end to end through kdtree: train (or load) the models, check
losslessness, measure acceptance lengths, tokens per second against autoregressive decoding and
the per-op time of a step.

  python -m examples.ddtree.run                       # the H200 run (kdtree backend, CUDA graphs)
  python -m examples.ddtree.run --preset tiny --device cpu --backend torch --quick   # anywhere
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from . import bench, checks, train
from .engine import load_backend, tree_width


def log(*a):
    print(*a, flush=True)


def prompt_set(preset, n, lo, hi, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return train.corpus_prompts(preset, lengths, seed=seed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h200", choices=sorted(train.PRESETS))
    ap.add_argument("--backend", default="kdtree", choices=["kdtree", "torch"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--budgets", default="16,32,64,128")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--prompt-lens", default="32,256", help="min,max prompt length (bytes)")
    ap.add_argument("--check-budget", type=int, default=63, help="tree budget of the correctness checks")
    ap.add_argument("--greedy-requests", type=int, default=32)
    ap.add_argument("--tv-samples", type=int, default=4096)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--no-cache", action="store_true", help="train even if cached weights exist")
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU smoke run)")
    ap.add_argument("--json", help="write every number here")
    a = ap.parse_args(argv)

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("run: --device cuda but torch sees no CUDA device (use --device cpu --backend torch)")
    if a.backend == "kdtree" and device.type != "cuda":
        sys.exit("run: the kdtree backend runs on CUDA devices only (use --backend torch on a CPU)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if a.quick:
        a.batches, a.budgets, a.max_new, a.prompt_lens = "1,4", "16", 32, "8,40"
        a.greedy_requests, a.tv_samples = 4, 400
    batches = [int(x) for x in a.batches.split(",")]
    budgets = []
    for b in (int(x) for x in a.budgets.split(",")):
        if b >= 128:
            log(f"note: budget {b} does not fit the largest tree width W=128 (root + budget <= W): using 127")
            b = 127
        budgets.append(b)
    lo, hi = (int(x) for x in a.prompt_lens.split(","))
    ops = load_backend(a.backend)
    report = {"args": vars(a)}
    t_start = time.time()

    log(f"== models ({a.preset})")
    target, drafter, cfg, info = train.get_models(a.preset, device, log=log, use_cache=not a.no_cache)
    target, drafter = target.to(dtype), drafter.to(dtype)
    models = (target, drafter, cfg)
    report["models"] = info
    if device.type == "cuda":
        log(f"device: {torch.cuda.get_device_name(device)}, backend {a.backend}, "
            f"CUDA graphs {'off' if a.no_graphs else 'on'}")
    kw = dict(device=device, dtype=dtype)

    log(f"\n== greedy: speculative (budget {a.check_budget}) vs autoregressive, {a.greedy_requests} requests")
    prompts = prompt_set(a.preset, a.greedy_requests, lo, hi, seed=1)
    g = checks.greedy_equality(models, ops, prompts, max_new=a.max_new, budget=a.check_budget, top_k=a.top_k, **kw)
    report["greedy"] = {k: v for k, v in g.items() if not k.endswith("_tokens")}
    log(f"identical: {g['equal']}/{len(prompts)} requests; divergences at near-ties: {g['near_tie_divergences']}, "
        f"elsewhere: {g['other_divergences']} (numeric margin noise {g['numeric_margin_noise']:.4f})")
    for r in g["requests"]:
        if not r["equal"]:
            log(f"  request {r['request']} (prompt {r['prompt_len']}): first divergence at token "
                f"{r['first_divergence']}, target top-2 margin {r['ar_margin']:.4f} "
                f"({'near-tie' if r['near_tie'] else 'NOT a near-tie'})")
    log("sample (request 0): " + repr(bytes(g["spec_tokens"][0][:120]).decode("utf-8", "replace")))

    log(f"\n== sampling at temperature 1: first 3 tokens, {a.tv_samples} streams each (spec vs AR, disjoint streams)")
    tv = checks.sampling_tv(models, ops, prompts[0], n_samples=a.tv_samples, budget=a.check_budget, top_k=a.top_k,
                            **kw)
    report["sampling_tv"] = tv
    for name, st in tv["stats"].items():
        ok = "ok" if st["tv"] <= st["threshold"] else "EXCEEDS"
        log(f"  {name:16s} TV {st['tv']:.4f}  threshold {st['threshold']:.4f} (permutation, alpha {tv['alpha']}; "
            f"null mean {st['null_mean_tv']:.4f}; {st['support_seen']} values seen)  p={st['p_value']:.3f}  {ok}")
    log(f"  same streams, spec vs AR: {100 * tv['coupled_identical_fraction']:.2f}% identical token triples")

    log(f"\n== throughput: {a.max_new} new tokens per request, prompts {lo}..{hi} bytes, "
        f"{'CUDA graphs' if device.type == 'cuda' and not a.no_graphs else 'eager'}")
    rows = []
    for B in batches:
        ps = prompt_set(a.preset, B, lo, hi, seed=100 + B)
        ar = bench.throughput(models, ops, ps, mode="ar", max_new=a.max_new, graphs=not a.no_graphs, **kw)
        row = {"batch": B, "ar": {k: v for k, v in ar.items() if k not in ("engine", "accept_lens")}, "spec": []}
        log(f"  batch {B:3d}  AR: {ar['tokens_per_s']:9.0f} tok/s  ({ar['step_ms']:.3f} ms/step)")
        for bud in budgets:
            sp = bench.throughput(models, ops, ps, mode="spec", max_new=a.max_new, budget=bud, top_k=a.top_k,
                                  graphs=not a.no_graphs, **kw)
            hist = torch.bincount(torch.tensor(sp["accept_lens"]), minlength=cfg.draft_depth + 1).tolist()
            entry = {k: v for k, v in sp.items() if k not in ("engine", "accept_lens")}
            entry.update(W=tree_width(bud), accept_hist=hist, speedup=sp["tokens_per_s"] / ar["tokens_per_s"],
                         predicted_speedup=sp["tokens_per_step"] * ar["step_ms"] / sp["step_ms"])
            row["spec"].append(entry)
            log(f"             DDTree budget {bud:3d} (W={entry['W']:3d}): {sp['tokens_per_s']:9.0f} tok/s  "
                f"{sp['step_ms']:.3f} ms/step  {sp['tokens_per_step']:.2f} tok/step  speedup {entry['speedup']:.2f}x "
                f"(= {sp['tokens_per_step']:.2f} tok/step x AR/spec step time {ar['step_ms'] / sp['step_ms']:.3f}"
                f" -> {entry['predicted_speedup']:.2f}x)")
        rows.append(row)
    report["throughput"] = rows

    log("\n== acceptance length per step (greedy; from the largest batch's runs)")
    log(f"  {'budget':>6} {'W':>4} {'mean accepted':>14} {'tokens/step':>12}  histogram of accepted draft tokens 0..{cfg.draft_depth}")
    for e in rows[-1]["spec"]:
        h = e["accept_hist"]
        mean_acc = sum(i * c for i, c in enumerate(h)) / max(1, sum(h))
        log(f"  {e['budget']:>6} {e['W']:>4} {mean_acc:>14.2f} {e['tokens_per_step']:>12.2f}  {h}")

    log("\n== speedup table (tokens/s, DDTree at its best budget for the batch)")
    log(f"  {'batch':>5} {'AR tok/s':>10} {'DDTree tok/s':>13} {'budget':>6} {'speedup':>8} {'tok/step':>9} "
        f"{'AR ms/step':>11} {'DDTree ms/step':>15}")
    for row in rows:
        best = max(row["spec"], key=lambda e: e["tokens_per_s"])
        row["best_budget"] = best["budget"]
        log(f"  {row['batch']:>5} {row['ar']['tokens_per_s']:>10.0f} {best['tokens_per_s']:>13.0f} {best['budget']:>6} "
            f"{best['speedup']:>7.2f}x {best['tokens_per_step']:>9.2f} {row['ar']['step_ms']:>11.3f} "
            f"{best['step_ms']:>15.3f}")

    log("\n== time per step of each op (ms, median; " +
        ("one CUDA graph per stage)" if device.type == "cuda" else "host time of each eager stage)"))
    report["ops"] = {}
    for B in sorted({batches[0], batches[-1]}):
        row = next(r for r in rows if r["batch"] == B)
        ps = prompt_set(a.preset, B, lo, hi, seed=100 + B)
        for mode, bud in (("ar", None), ("spec", row["best_budget"])):
            from .engine import Engine
            e = Engine(target, drafter, cfg, ops, mode=mode, batch_size=B, max_prompt=max(map(len, ps)),
                       max_new=a.max_new, budget=bud or 63, top_k=a.top_k, **kw)
            t = bench.op_breakdown(e, ps)
            key = f"batch {B} {mode}" + (f" budget {bud}" if bud else "")
            report["ops"][key] = t
            log(f"  {key}: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))

    log("\n== bad input")
    from .engine import Engine
    try:
        e = Engine(target, drafter, cfg, ops, mode="spec", batch_size=1, max_prompt=64, max_new=16, budget=15,
                   top_k=a.top_k, **kw)
        e.admit([[32] * 200])
    except ValueError as ex:
        log(f"  prompt longer than the cache: ValueError: {ex}")
    try:
        e = Engine(target, drafter, cfg, ops, mode="spec", batch_size=8, max_prompt=64, max_new=16, budget=15,
                   top_k=a.top_k, num_pages=4, **kw)
        e.admit([[32] * 64] * 8)
    except ValueError as ex:
        log(f"  batch larger than the pages allow: ValueError: {ex}")

    report["seconds"] = time.time() - t_start
    log(f"\ndone in {report['seconds']:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return report


if __name__ == "__main__":
    main()
