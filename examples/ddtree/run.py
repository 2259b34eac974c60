"""DDTree speculative decoding end to end through kdtree: train (or load) the models, check
losslessness, measure acceptance lengths, tokens per second against autoregressive decoding and
the per-op time of a step.

  python -m examples.ddtree.run                       # the H200 run (kdtree backend, CUDA graphs)
  python -m examples.ddtree.run --preset tiny --device cpu --backend torch --quick   # anywhere
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from . import bench, checks, paged_cache, train
from .engine import load_backend, tree_width


def log(*a):
    print(*a, flush=True)


SKIP = set()


def run_section(name, fn, failed):
    """Runs one part of the report; a failure is printed with its traceback and the rest still runs."""
    if name in SKIP:
        return
    try:
        fn()
    except Exception:  # noqa: BLE001 - report and go on: the device run is expensive
        import traceback
        log(f"!! section {name} failed:\n{traceback.format_exc()}")
        failed.append(name)


def eager_note(r):
    if r.get("graph_error"):
        return f"  [EAGER: CUDA graph capture failed: {r['graph_error'][:300]}]"
    return ""


def prompt_set(preset, n, lo, hi, seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    return train.corpus_prompts(preset, lengths, seed=seed)


def throughput_groups(preset, B, batch1_prompts, lo, hi):
    """The prompt groups the throughput section decodes at batch B (examples/ddtree/trace.py traces the same):
    at batch 1, batch1_prompts prompts, one per group; else one batch of B corpus prompts."""
    if B == 1:
        return [[p] for p in prompt_set(preset, batch1_prompts, lo, hi, seed=101)]
    return [prompt_set(preset, B, lo, hi, seed=100 + B)]


def summary_line(row, ops):
    """One batch: the speedup as its two factors, and which stages make the DDTree step longer than the
    AR step (from the per-op times, when measured): mostly the target forward over B x (budget + 1) rows."""
    B, ar = row["batch"], row["ar"]
    best = next(e for e in row["spec"] if e["budget"] == row["best_budget"])
    line = (f"batch {B:>2}: DDTree budget {best['budget']} {best['tokens_per_s']:.0f} tok/s vs AR "
            f"{ar['tokens_per_s']:.0f} = {best['speedup']:.2f}x = {best['batch_tokens_per_step']:.2f} tok/step x "
            f"{best['step_time_ratio']:.3f} (AR {ar['step_ms']:.3f} / DDTree {best['step_ms']:.3f} ms per step)")
    t_ar, t_sp = ops.get(f"batch {B} ar"), ops.get(f"batch {B} spec budget {best['budget']}")
    if not t_ar or not t_sp:
        return line
    stages = lambda t: {k: v for k, v in t.items() if not k.startswith("verify_attention")}
    d_total = sum(stages(t_sp).values()) - sum(stages(t_ar).values())
    d_target = t_sp["target"] - t_ar["target"]
    tree_ops = sum(t_sp.get(k, 0.0) for k in ("tree_build", "tree_accept", "kv_compact"))
    rest = d_total - d_target - t_sp.get("drafter", 0.0) - tree_ops
    n = best["budget"] + 1
    va_key = "verify_attention (all layers)"
    va = (f"; of it verify_attention {t_sp[va_key] - t_ar[va_key]:+.3f}" if va_key in t_sp and va_key in t_ar else "")
    return (line + f"\n            the DDTree step adds {d_total:.3f} ms: target forward {d_target:+.3f} ms "
            f"({t_ar['target']:.3f} -> {t_sp['target']:.3f} ms, {t_sp['target'] / t_ar['target']:.2f}x, for "
            f"{n}x the rows: {B * n} vs {B}{va}), drafter {t_sp.get('drafter', 0):.3f}, "
            f"tree_build+tree_accept+kv_compact {tree_ops:.3f}, sampling+update {rest:+.3f}")


def calibrate_kv_scale(target, prompts, device):
    """The e4m3 cache scale from the data: the largest |value| of the cache rows (every layer) of the target's
    prefill over `prompts`, through paged_cache.scale_for (a power of two, 2x headroom). One fixed scale for
    every engine of the run, so spec and AR decode over the same fp8 cache."""
    amax = 0.0
    with torch.no_grad():
        for p in prompts:
            _, _, rows = target(torch.tensor([p], device=device))
            amax = max(amax, max(float(r.float().abs().max()) for r in rows))
    return paged_cache.scale_for(amax)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="h200", choices=sorted(train.PRESETS))
    ap.add_argument("--backend", default="kdtree", choices=["kdtree", "torch"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--budgets", default="15,16,31,32,63,64,128",
                    help="fixed budgets measured at every batch: each tree width's first (16, 32, 64) and last "
                         "(15, 31, 63, 127) budget, since a round's cost steps up with the width")
    ap.add_argument("--small-budgets", default="2,3,4,6,8",
                    help="extra budgets (W=16) measured at batches >= --small-budgets-from, where the target's "
                         "forward over B x (budget+1) rows makes large trees expensive")
    ap.add_argument("--small-budgets-from", type=int, default=16)
    ap.add_argument("--batch1-prompts", type=int, default=8,
                    help="batch 1 is measured over this many prompts, one at a time (one prompt alone can be a "
                         "lucky repetition loop); tokens/s = all tokens / total time")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--budget", choices=["auto"], default=None,
                    help="auto: also decode with a per-round budget chosen from the measured step cost at the batch "
                         "and the drafter's confidence (kdtree.integrations.budget), compared with the best fixed one")
    ap.add_argument("--auto-reps", type=int, default=1,
                    help="with --budget auto: then measure auto and the two best fixed budgets of the sweep again, this "
                         "many times in alternation, and compare their medians (one run of each is within the noise)")
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--prompt-lens", default="32,224",
                    help="min,max prompt length (bytes); with --max-new within the training length 512")
    ap.add_argument("--check-budget", type=int, default=63, help="tree budget of the correctness checks")
    ap.add_argument("--greedy-requests", type=int, default=32)
    ap.add_argument("--tv-samples", type=int, default=4096)
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--no-cache", action="store_true", help="train even if cached weights exist")
    ap.add_argument("--quick", action="store_true", help="small sizes (CPU smoke run)")
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--throughput-weights", default="as_attention", choices=["as_attention", "float32"],
                    help="the models' weights in the throughput section: as_attention (bf16 on a GPU, as served) or "
                         "float32 (bf16 cache and attention still); float32's greedy text did not depend on the "
                         "budget where bf16's did at near-ties, so budgets and auto compare on the same text")
    ap.add_argument("--kv-dtype", default="as_q", choices=["as_q", "e4m3"],
                    help="the paged cache's storage: as_q (the attention dtype) or e4m3 (torch.float8_e4m3fn, one "
                         "scale per cache; every check and measurement then runs over the fp8 cache)")
    ap.add_argument("--kv-scale", type=float, default=0.0,
                    help="e4m3 cache scale (value = code x scale); 0 = calibrated: the power of two that maps twice "
                         "the largest |row value| of the target's prefill over the greedy prompts to <= 448")
    ap.add_argument("--alloc", default="request", choices=["request", "batch"],
                    help="the fixed budgets' node allocation: request (budget draft nodes per request) or batch (a "
                         "round's B x budget nodes go to the batch's most valuable: probability x how far behind, "
                         "kdtree.integrations.allocate)")
    ap.add_argument("--auto-alloc", default="request", choices=["request", "batch"],
                    help="budget auto's node allocation (as --alloc)")
    ap.add_argument("--skip", default="", help="comma-separated sections to skip: greedy, sampling, throughput, "
                                               "acceptance, speedup, ops, bad_input")
    a = ap.parse_args(argv)

    SKIP.update(x for x in a.skip.split(",") if x)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("run: --device cuda but torch sees no CUDA device (use --device cpu --backend torch)")
    if a.backend == "kdtree" and device.type != "cuda":
        sys.exit("run: the kdtree backend runs on CUDA devices only (use --backend torch on a CPU)")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if a.quick:
        a.batches, a.budgets, a.max_new, a.prompt_lens = "1,4", "16", 32, "8,40"
        a.greedy_requests, a.tv_samples, a.batch1_prompts, a.small_budgets = 4, 400, 3, "8"
    batches = [int(x) for x in a.batches.split(",")]
    budgets = []
    for b in (int(x) for x in a.budgets.split(",")):
        if b >= 128:
            log(f"note: budget {b} does not fit the largest tree width W=128 (root + budget <= W): using 127")
            b = 127
        budgets.append(b)
    small_budgets = [int(x) for x in a.small_budgets.split(",") if x]

    def budgets_for(B):
        return sorted(set(budgets + (small_budgets if B >= a.small_budgets_from else [])))

    groups_of = {}  # batch size -> prompt groups (reading the corpus takes a second)

    def prompt_groups(B):
        if B not in groups_of:
            groups_of[B] = throughput_groups(a.preset, B, a.batch1_prompts, lo, hi)
        return groups_of[B]

    lo, hi = (int(x) for x in a.prompt_lens.split(","))
    ops = load_backend(a.backend)
    report = {"args": vars(a)}
    t_start = time.time()

    log(f"== models ({a.preset})")
    target, drafter, cfg, info = train.get_models(a.preset, device, log=log, use_cache=not a.no_cache)
    import copy
    models_f32 = (target, drafter, cfg)  # float32 weights (the tight greedy check)
    target, drafter = copy.deepcopy(target).to(dtype), copy.deepcopy(drafter).to(dtype)
    models = (target, drafter, cfg)
    report["models"] = info
    if device.type == "cuda":
        log(f"device: {torch.cuda.get_device_name(device)}, backend {a.backend}, "
            f"CUDA graphs {'off' if a.no_graphs else 'on'}")
    kw = dict(device=device, dtype=dtype)
    rows = []
    prompts = prompt_set(a.preset, a.greedy_requests, lo, hi, seed=1)
    if a.kv_dtype == "e4m3":
        kw.update(kv_dtype=paged_cache.E4M3, kv_scale=a.kv_scale or calibrate_kv_scale(target, prompts, device))
        log(f"KV cache: e4m3 (torch.float8_e4m3fn), scale {kw['kv_scale']:g}"
            f"{'' if a.kv_scale else ' (calibrated)'}")
        report["kv_cache"] = {"dtype": "e4m3", "scale": kw["kv_scale"], "calibrated": not a.kv_scale}

    failed = []
    state = {}
    def sec_greedy():
        kv = ", e4m3 KV cache" if a.kv_dtype == "e4m3" else ""
        configs = [(("bf16 model" if dtype == torch.bfloat16 else f"{dtype} model") + kv, models)]
        if dtype != torch.float32:
            configs.append((f"float32 model, {'e4m3' if kv else 'bf16'} KV cache and bf16 attention", models_f32))
        report["greedy"] = {}
        for label, mdl in configs:
            log(f"\n== greedy ({label}): speculative (budget {a.check_budget}) vs autoregressive, "
                f"{a.greedy_requests} requests x {a.max_new} tokens")
            g = checks.greedy_equality(mdl, ops, prompts, max_new=a.max_new, budget=a.check_budget, top_k=a.top_k,
                                       **kw)
            report["greedy"][label] = {k: v for k, v in g.items() if not k.endswith("_tokens")}
            log(f"identical: {g['equal']}/{len(prompts)} requests; divergences at near-ties: "
                f"{g['near_tie_divergences']}, elsewhere: {g['other_divergences']} (numeric noise of the top-2 "
                f"margin, max over the agreeing positions: {g['numeric_margin_noise']:.2e}); "
                f"{g['mean_tokens_per_step']:.2f} tokens/step")
            for r in g["requests"]:
                if not r["equal"]:
                    log(f"  request {r['request']} (prompt {r['prompt_len']}): first divergence at token "
                        f"{r['first_divergence']}: target top-2 margin {r['ar_margin']:.2e} (AR) / "
                        f"{r['spec_margin']:.2e} (spec) {'<=' if r['near_tie'] else '>'} numeric noise "
                        f"{g['numeric_margin_noise']:.2e} -> {'near-tie' if r['near_tie'] else 'NOT a near-tie'}")
            log("  sample (request 0): " + repr(bytes(g["spec_tokens"][0][:160]).decode("utf-8", "replace")))

    run_section('greedy', sec_greedy, failed)

    def sec_sampling():
        nonlocal rows
        log(f"\n== sampling at temperature 1: first 3 tokens, {a.tv_samples} streams each (spec vs AR, disjoint streams)")
        tv = checks.sampling_tv(models, ops, prompts[0], n_samples=a.tv_samples, budget=a.check_budget, top_k=a.top_k,
                                **kw)
        report["sampling_tv"] = tv
        for name, st in tv["stats"].items():
            ok = "ok" if st["tv"] <= st["threshold"] else "EXCEEDS"
            log(f"  {name:16s} TV {st['tv']:.4f}  threshold {st['threshold']:.4f} (permutation, alpha {tv['alpha']}; "
                f"null mean {st['null_mean_tv']:.4f}; {st['support_seen']} values seen)  p={st['p_value']:.3f}  {ok}")
        log(f"  same streams, spec vs AR: {100 * tv['coupled_identical_fraction']:.2f}% identical token triples "
            f"(independent streams: {100 * tv['independent_identical_fraction']:.2f}% by chance)")

    run_section('sampling', sec_sampling, failed)

    def spread(xs):
        xs = sorted(xs)
        return f"min {xs[0]:.2f}, median {xs[len(xs) // 2]:.2f}, max {xs[-1]:.2f}"

    def sec_throughput():
        nonlocal rows
        log(f"\n== throughput: {a.max_new} new tokens per request, prompts {lo}..{hi} bytes, "
            f"{'CUDA graphs' if device.type == 'cuda' and not a.no_graphs else 'eager'}")
        log(f"  speedup = tokens/s ratio = (tokens per request per step of the batch, which waits for its slowest "
            f"request) x (AR / DDTree step time), exactly; in brackets the same with the mean per-request tokens/step")
        tmodels = models_f32 if a.throughput_weights == "float32" else models
        if a.throughput_weights == "float32":
            log(f"  float32 weights (--throughput-weights float32), {str(dtype).replace('torch.', '')} cache and "
                f"attention")
        rows = []
        for B in batches:
            groups = prompt_groups(B)
            ar = bench.throughput(tmodels, ops, groups, mode="ar", max_new=a.max_new, graphs=not a.no_graphs, **kw)
            row = {"batch": B, "prompts": len(groups) * B,
                   "ar": {k: v for k, v in ar.items() if k not in ("engine", "accept_lens", "request_tokens_per_step")},
                   "spec": []}
            how = (f"; {len(groups)} prompts one at a time, tokens/s = all tokens / total time" if len(groups) > 1
                   else "")
            log(f"  batch {B:3d}  AR: {ar['tokens_per_s']:9.0f} tok/s  ({ar['step_ms']:.3f} ms/step{how})"
                + eager_note(ar))
            engines = {}  # --auto-reps: the fixed budgets' engines, measured again beside auto's
            for bud in budgets_for(B):
                sp = bench.throughput(tmodels, ops, groups, mode="spec", max_new=a.max_new, budget=bud, top_k=a.top_k,
                                      graphs=not a.no_graphs, alloc=a.alloc, **kw)
                if a.budget == "auto" and a.auto_reps > 1:
                    engines[bud] = sp["engine"]
                hist = torch.bincount(torch.tensor(sp["accept_lens"], dtype=torch.int64),
                                      minlength=cfg.draft_depth + 1).tolist()
                entry = {k: v for k, v in sp.items() if k not in ("engine", "accept_lens")}
                ratio = ar["step_ms"] / sp["step_ms"]
                entry.update(W=tree_width(bud), accept_hist=hist, speedup=sp["tokens_per_s"] / ar["tokens_per_s"],
                             step_time_ratio=ratio, predicted_speedup=sp["tokens_per_step"] * ratio)
                row["spec"].append(entry)
                log(f"             DDTree budget {bud:3d} (W={entry['W']:3d}): {sp['tokens_per_s']:9.0f} tok/s  "
                    f"{sp['step_ms']:.3f} ms/step  {sp['tokens_per_step']:.2f} tok/step  speedup {entry['speedup']:.2f}x"
                    f" = {sp['batch_tokens_per_step']:.2f} x {ratio:.3f} ({sp['tokens_per_step']:.2f} x {ratio:.3f} = "
                    f"{entry['predicted_speedup']:.2f}x)" + eager_note(sp))
                per = sp["request_tokens_per_step"]
                if len(groups) > 1:
                    log(f"                 tokens/step per prompt: {' '.join(f'{x:.2f}' for x in per)} ({spread(per)})")
                elif B > 1:
                    log(f"                 tokens/step per request: {spread(per)}")
            if a.budget == "auto":
                sp = bench.throughput(tmodels, ops, groups, mode="spec", max_new=a.max_new, budget="auto",
                                      top_k=a.top_k, graphs=not a.no_graphs, alloc=a.auto_alloc, **kw)
                best = max(row["spec"], key=lambda e: e["tokens_per_s"])
                used = sp["budgets_used"]
                hist = {b: used.count(b) for b in sorted(set(used))}
                row["auto"] = {k: v for k, v in sp.items() if k not in ("engine", "accept_lens", "budgets_used")}
                row["auto"].update(budget_histogram=hist, speedup=sp["tokens_per_s"] / ar["tokens_per_s"],
                                   vs_best_fixed=sp["tokens_per_s"] / best["tokens_per_s"],
                                   best_fixed_budget=best["budget"], costs_ms=sp["costs_ms"])
                log(f"             DDTree budget auto  : {sp['tokens_per_s']:9.0f} tok/s  {sp['step_ms']:.3f} ms/step  "
                    + ("(nodes allocated over the batch)  " if a.auto_alloc == "batch" else "") +
                    f"{sp['tokens_per_step']:.2f} tok/step  speedup {row['auto']['speedup']:.2f}x; "
                    f"{row['auto']['vs_best_fixed']:.3f}x the best fixed budget ({best['budget']}) "
                    f"{'>=' if row['auto']['vs_best_fixed'] >= 1 else '<'} 1; budgets chosen {hist}; "
                    f"measured step ms by budget {sp['costs_ms']}; estimated tok/step by budget "
                    f"{sp['estimated_tokens_per_step']}" + eager_note(sp))
                if a.auto_reps > 1:
                    top = sorted(row["spec"], key=lambda e: -e["tokens_per_s"])[:2]
                    contenders = {f"budget {e['budget']}": engines[e["budget"]] for e in top}
                    contenders["auto"] = sp["engine"]
                    runs = bench.alternate(contenders, groups, reps=a.auto_reps)
                    med = {n: statistics.median(v) for n, v in runs.items()}
                    best_n = max((n for n in med if n != "auto"), key=med.get)
                    ratio = med["auto"] / med[best_n]
                    per_rep = [x / max(runs[n][i] for n in runs if n != "auto") for i, x in enumerate(runs["auto"])]
                    row["auto"].update(reps=a.auto_reps, reps_tokens_per_s=runs, reps_median=med,
                                       vs_best_fixed_median=ratio, best_fixed_median=best_n,
                                       vs_best_fixed_per_rep=per_rep)
                    log(f"             {a.auto_reps} alternating repetitions, tok/s (median): " + "; ".join(
                        f"{n} {med[n]:.0f} [{' '.join(f'{x:.0f}' for x in v)}]" for n, v in runs.items()))
                    log(f"             auto / best fixed ({best_n}), medians: {ratio:.3f}x "
                        f"{'>=' if ratio >= 1 else '<'} 1; by repetition (auto / best fixed of that repetition): "
                        f"{' '.join(f'{x:.3f}' for x in per_rep)}")
                engines.clear()
            rows.append(row)
        report["throughput"] = rows

    run_section('throughput', sec_throughput, failed)

    def sec_acceptance():
        nonlocal rows
        log("\n== acceptance length per step (greedy; from the largest batch's runs)")
        log(f"  {'budget':>6} {'W':>4} {'mean accepted':>14} {'tokens/step':>12}  histogram of accepted draft tokens 0..{cfg.draft_depth}")
        for e in rows[-1]["spec"]:
            h = e["accept_hist"]
            mean_acc = sum(i * c for i, c in enumerate(h)) / max(1, sum(h))
            log(f"  {e['budget']:>6} {e['W']:>4} {mean_acc:>14.2f} {e['tokens_per_step']:>12.2f}  {h}")

    run_section('acceptance', sec_acceptance, failed)

    def sec_speedup():
        nonlocal rows
        log("\n== speedup table (tokens/s, DDTree at its best budget for the batch)")
        log(f"  {'batch':>5} {'prompts':>7} {'AR tok/s':>10} {'DDTree tok/s':>13} {'budget':>6} {'speedup':>8} {'tok/step':>9} "
            f"{'AR ms/step':>11} {'DDTree ms/step':>15}")
        for row in rows:
            best = max(row["spec"], key=lambda e: e["tokens_per_s"])
            row["best_budget"] = best["budget"]
            log(f"  {row['batch']:>5} {row['prompts']:>7} {row['ar']['tokens_per_s']:>10.0f} {best['tokens_per_s']:>13.0f} {best['budget']:>6} "
                f"{best['speedup']:>7.2f}x {best['tokens_per_step']:>9.2f} {row['ar']['step_ms']:>11.3f} "
                f"{best['step_ms']:>15.3f}")
            if "auto" in row:
                au = row["auto"]
                log(f"  {row['batch']:>5} {row['prompts']:>7} {row['ar']['tokens_per_s']:>10.0f} {au['tokens_per_s']:>13.0f} "
                    f"{'auto':>6} {au['speedup']:>7.2f}x {au['tokens_per_step']:>9.2f} {row['ar']['step_ms']:>11.3f} "
                    f"{au['step_ms']:>15.3f}   ({au['vs_best_fixed']:.3f}x best fixed"
                    + (f"; medians of {au['reps']} alternating repetitions: {au['vs_best_fixed_median']:.3f}x "
                       f"{au['best_fixed_median']}" if "reps" in au else "") + ")")

    run_section('speedup', sec_speedup, failed)

    def sec_ops():
        nonlocal rows
        log("\n== time per step of each op (ms, median; " +
            ("one CUDA graph per stage)" if device.type == "cuda" else "host time of each eager stage)"))
        report["ops"] = {}
        for row in rows:
            B = row["batch"]
            ps = prompt_groups(B)[0]
            for mode, bud in (("ar", None), ("spec", row["best_budget"])):
                from .engine import Engine
                e = Engine(target, drafter, cfg, ops, mode=mode, batch_size=B, max_prompt=max(map(len, ps)),
                           max_new=a.max_new, budget=bud or 63, top_k=a.top_k, alloc=a.alloc, **kw)
                t = bench.op_breakdown(e, ps)
                key = (f"batch {B} {mode}" + (f" budget {bud}" if bud else "")
                       + (" (nodes allocated over the batch)" if e.alloc == "batch" else ""))
                report["ops"][key] = t
                log(f"  {key}: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()))

    run_section('ops', sec_ops, failed)

    def sec_bad_input():
        nonlocal rows
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

    run_section('bad_input', sec_bad_input, failed)

    if rows and all("best_budget" in r for r in rows):
        log("\n== summary: speedup = tokens per request per step x (AR / DDTree step time); what the DDTree step adds")
        for row in rows:
            log("  " + summary_line(row, report.get("ops", {})))
    report["failed_sections"] = failed
    report["seconds"] = time.time() - t_start
    log(f"\ndone in {report['seconds']:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if failed:
        log(f"FAILED sections: {', '.join(failed)}")
        sys.exit(1)
    return report


if __name__ == "__main__":
    main()
