"""Tokens/s of a transformers model (examples/ddtree/hf.py presets) decoded four ways, and the per-stage split
of a DDTree round:
  generate   the model's own generate(do_sample=False) (its dense KV cache and attention)
  ar         one token per round through kdtree's paged cache and verify_attention
  ddtree     DDTree through kdtree (fixed budget, and --budget auto chosen each round from cost); "ddtree N b":
             the same B x N draft nodes a round allocated over the batch (alloc "batch"; batches above 1)
  sdpa       DDTree verified by torch SDPA over a dense ancestor mask (the DDTree reference method)
tokens/s = batch x new tokens / wall time including prefill (best of --repeats after a warm run).

  python -m examples.ddtree.hf_bench --presets deepseek-small,qwen3-small --batches 1,8        # H200
  python -m examples.ddtree.hf_bench --presets qwen3-tiny --device cpu --backend torch --batches 1,2 --max-new 16

--auto-check instead: budget auto against every fixed budget it chooses among (one run each), then against the
two best of them again, --reps times in alternation, compared by medians (one run of each is within the noise).
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time

import torch

from . import hf


def log(*a):
    print(*a, flush=True)


def timed(fn, repeats, sync):
    fn()  # warm: kernels, allocator, cuBLAS heuristics
    best, out = None, None
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        dt = time.perf_counter() - t
        best = dt if best is None or dt < best else best
    return best, out


def once(fn, sync):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - t, out


def auto_check(a, preset, model, drafter, dcfg, dev, dtype, sync, report):
    """budget auto against the fixed budgets it chooses among (DEFAULT_BUDGETS within the drafter's tree):
    each decoder warmed once (auto: its calibration), every fixed budget timed once, then the two best fixed
    budgets and auto timed --reps times in turn (reversed every other repetition); medians compared."""
    from kdtree.integrations.budget import DEFAULT_BUDGETS
    most = min(sum(a.top_k ** d for d in range(1, dcfg.draft_depth + 1)), 127)
    fixed = [b for b in DEFAULT_BUDGETS if b <= most]
    log(f"\n== {preset}: budget auto (alloc {a.auto_alloc}) vs fixed {fixed}, {type(model).__name__}, {dtype}, "
        f"backend {a.backend}, "
        f"{a.max_new} new tokens, prompts of {a.prompt_len} tokens, {a.reps} alternating repetitions")
    for B in (int(x) for x in a.batches.split(",")):
        ps = hf.prompts(preset, [a.prompt_len] * B, seed=21 + B)
        kw = dict(backend=a.backend, top_k=a.top_k, cache_dtype=torch.bfloat16 if dev.type == "cuda" else dtype)
        decs = {f"budget {b}": hf.decoder(model, drafter, dcfg, budget=b, **kw) for b in fixed}
        decs["auto"] = hf.decoder(model, drafter, dcfg, budget="auto", alloc=a.auto_alloc, **kw)
        tps = B * a.max_new
        sweep = {}
        for name, dec in decs.items():
            dec.generate(ps, a.max_new)  # warm (auto: calibrates at this batch)
            if name != "auto":
                sweep[name] = tps / once(lambda: dec.generate(ps, a.max_new), sync)[0]
        top = sorted(sweep, key=sweep.get, reverse=True)[:2] + ["auto"]
        runs, used = {n: [] for n in top}, []
        for r in range(a.reps):
            for n in (top if r % 2 == 0 else top[::-1]):
                t, out = once(lambda: decs[n].generate(ps, a.max_new), sync)
                runs[n].append(tps / t)
                if n == "auto":
                    used += out.budgets
        med = {n: statistics.median(v) for n, v in runs.items()}
        best = max(top[:-1], key=med.get)
        ratio = med["auto"] / med[best]
        costs = {b: round(1e3 * s, 3) for b, s in decs["auto"].costs.row(B).items()}
        hist = {b: used.count(b) for b in sorted(set(used))}
        log(f"  batch {B}: one run each, tok/s: " + ", ".join(f"{n.split()[-1]} {v:.0f}" for n, v in sweep.items()))
        log(f"  batch {B}: alternating, tok/s (median [runs]): " + "; ".join(
            f"{n} {med[n]:.0f} [{' '.join(f'{x:.0f}' for x in v)}]" for n, v in runs.items()))
        log(f"  batch {B}: auto / best fixed ({best}), medians: {ratio:.3f}x {'>=' if ratio >= 1 else '<'} 1; "
            f"auto's budgets {hist}; its cost table, ms/round by budget {costs}")
        report["results"].append({"preset": preset, "batch": B, "method": "auto check", "sweep_tokens_per_s": sweep,
                                  "reps_tokens_per_s": runs, "medians": med, "best_fixed": best,
                                  "auto_vs_best_fixed_median": ratio, "auto_budgets": hist, "auto_costs_ms": costs})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="deepseek-small,qwen3-small")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="kdtree", choices=["kdtree", "torch"])
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--budget", type=int, default=31, help="the fixed DDTree budget")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--auto-check", action="store_true",
                    help="only budget auto against the fixed budgets it chooses among, alternated --reps times")
    ap.add_argument("--reps", type=int, default=3, help="--auto-check: alternating repetitions")
    ap.add_argument("--auto-alloc", default="request", choices=["request", "batch"],
                    help="--auto-check: auto's node allocation (request: budget nodes per request; batch: a round's "
                         "B x budget nodes to the batch's most valuable, kdtree.integrations.allocate)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("hf_bench: --device cuda but torch sees no CUDA device")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    report = {"args": vars(a), "results": []}
    for preset in a.presets.split(","):
        model, drafter, dcfg, info = hf.get_models(preset, dev, log=log)
        model, drafter = copy.deepcopy(model).to(dtype), copy.deepcopy(drafter).to(dtype)
        if a.auto_check:
            auto_check(a, preset, model, drafter, dcfg, dev, dtype, sync, report)
            continue
        log(f"\n== {preset}: {type(model).__name__}, {dtype}, backend {a.backend}, {a.max_new} new tokens, "
            f"prompts of {a.prompt_len} tokens, DDTree budget {a.budget} (top-{a.top_k}, depth {dcfg.draft_depth})")
        log(f"  {'batch':>5} {'method':>14} {'tok/s':>9} {'vs generate':>11} {'ms/round':>9} {'tok/round':>9}")
        for B in (int(x) for x in a.batches.split(",")):
            ps = hf.prompts(preset, [a.prompt_len] * B, seed=21 + B)
            kw = dict(backend=a.backend, top_k=a.top_k, cache_dtype=torch.bfloat16 if dev.type == "cuda" else dtype)
            ids = torch.tensor(ps, device=dev)
            t_gen, _ = timed(lambda: model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                                    max_new_tokens=a.max_new, min_new_tokens=a.max_new,
                                                    do_sample=False, pad_token_id=0), a.repeats, sync)
            rows = [("generate", t_gen, a.max_new, None)]
            runs = [("ar (kdtree)", dict(budget=a.budget), "ar"), (f"ddtree {a.budget}", dict(budget=a.budget), "spec"),
                    ("ddtree auto", dict(budget="auto"), "spec"), (f"sdpa {a.budget}", dict(budget=a.budget,
                                                                                          attention="sdpa"), "spec")]
            if B > 1:  # the same B x budget nodes a round, allocated over the batch
                runs.insert(2, (f"ddtree {a.budget} b", dict(budget=a.budget, alloc="batch"), "spec"))
            decs = {}
            for name, extra, mode in runs:
                dec = hf.decoder(model, drafter, dcfg, **kw, **extra)
                decs[name] = dec
                t, out = timed(lambda: dec.generate(ps, a.max_new, mode=mode), a.repeats, sync)
                rows.append((name, t, out.steps, out))
            for name, t, steps, out in rows:
                tps = B * a.max_new / t
                extra = ""
                if out is not None and out.budgets and name.endswith("auto"):
                    used = {b: out.budgets.count(b) for b in sorted(set(out.budgets))}
                    costs = {b: round(1e3 * s, 3) for b, s in decs[name].costs.row(B).items()}
                    extra = f"  budgets chosen {used}; measured ms/round by budget {costs}"
                log(f"  {B:>5} {name:>14} {tps:>9.0f} {t_gen / t:>10.2f}x {1e3 * t / steps:>9.3f} "
                    f"{B * a.max_new / steps / B:>9.2f}{extra}")
                report["results"].append({"preset": preset, "batch": B, "method": name, "tokens_per_s": tps,
                                          "seconds": t, "rounds": steps,
                                          "budgets": out.budgets if out is not None else None})
            for name in (f"ddtree {a.budget}", f"sdpa {a.budget}"):
                prof = decs[name].generate(ps, a.max_new, profile=True)
                split = ", ".join(f"{k} {v:.3f}" for k, v in prof.stage_ms.items())
                log(f"  {B:>5} {name:>14} per-stage ms per round (synchronised per stage): {split}")
                report["results"].append({"preset": preset, "batch": B, "method": name + " stages",
                                          "stage_ms": prof.stage_ms})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
