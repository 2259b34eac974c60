"""Tokens/s of a transformers model (examples/ddtree/hf.py presets) decoded four ways, and the per-stage split
of a DDTree round:
  generate   the model's own generate(do_sample=False) (its dense KV cache and attention)
  ar         one token per round through kdtree's paged cache and verify_attention
  ddtree     DDTree through kdtree (fixed budget, and --budget auto chosen each round from cost)
  sdpa       DDTree verified by torch SDPA over a dense ancestor mask (the DDTree reference method)
tokens/s = batch x new tokens / wall time including prefill (best of --repeats after a warm run).

  python -m examples.ddtree.hf_bench --presets deepseek-small,qwen3-small --batches 1,8        # H200
  python -m examples.ddtree.hf_bench --presets qwen3-tiny --device cpu --backend torch --batches 1,2 --max-new 16
"""
from __future__ import annotations

import argparse
import copy
import json
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
