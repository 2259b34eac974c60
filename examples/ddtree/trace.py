"""Counterfactual traces of DDTree decoding, for judging budget policies offline (examples/ddtree/simulate.py).

A teacher-forced trace decodes every request one token per round: each round builds and verifies the largest
tree (budget 127), records the path tree_accept found, then keeps only the root's target token (the greedy next
token), so round g starts at generated count g. tree_build's budget-m tree is the first m + 1 nodes of the
budget-127 one (kdtree.integrations.budget.prefix_tree), so the recorded path says what every budget m <= 127
accepts at count g: its nodes of index <= m. Where the greedy text does not depend on the budget (float32
weights over the bf16 cache and attention, --throughput-weights float32 in run.py), any budget policy's run is a
walk through that table: at count g budget m accepts counts[g, m] draft tokens and the request moves to
g + 1 + counts[g, m]. The trace also keeps the tree's path log-probabilities (the drafter's confidence, what a
policy may read before a round) and each batch size's round cost by budget (the engine's calibration bursts:
rounds back to back, CUDA graphs, as the decoding loop runs them).

    python -m examples.ddtree.trace --out trace.npz   # on a CUDA machine; the prompts run.py measures

The .npz holds, per prompt group g (run.py's batch sizes: batch 1's prompts as one group, decoded together
here; the trace does not depend on the batch): g{i}_paths [max_new, B, depth] int16 (the accepted path's node
indices after the root, -1 past the accepted count), g{i}_scores [max_new, B, 128] float32 (tree_build's
scores), g{i}_tokens [B, max_new] (the text), and a JSON string `meta` with the batch sizes, the round costs
(seconds by budget, per batch size) and the text check (the trace's text against a fixed-budget decode).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from . import train
from .engine import Engine, load_backend

TRACE_BUDGET = 127
# Round costs are measured at these budgets: every width's smallest and largest, and the ones between.
COST_BUDGETS = (1, 2, 3, 4, 6, 8, 12, 15, 16, 24, 31, 32, 48, 63, 64, 96, 127)


@torch.no_grad()
def forced_trace(models, ops, prompts, *, max_new, top_k=8, device="cuda", dtype=torch.bfloat16):
    """The teacher-forced trace of `prompts` (one batch): dict(paths [max_new, B, depth] int16, acc [max_new, B]
    int16 (what budget 127 accepted), scores [max_new, B, 128] float32, tokens [B, max_new] int32)."""
    target, drafter, cfg = models
    B, D = len(prompts), cfg.draft_depth
    e = Engine(target, drafter, cfg, ops, mode="spec", batch_size=B, max_prompt=max(len(p) for p in prompts),
               max_new=max_new, budget=TRACE_BUDGET, top_k=top_k, device=device, dtype=dtype)
    e.admit(prompts)
    s, N = e.s, e.N
    stages = dict(e.stages())
    paths, acc, scores = [], [], []
    for _ in range(max_new):
        for name in ("drafter", "tree_build", "target", "sample_tokens", "tree_accept"):
            stages[name]()
        a = s["acc"]
        paths.append(torch.where(torch.arange(D, device=a.device)[None, :] < a[:, None].long(),
                                 s["path"][:, 1:D + 1], -1).to(torch.int16).cpu())
        acc.append(a.to(torch.int16).cpu())
        scores.append(s["tree"].scores[:, :N].float().cpu())
        # Keep the root only: the bonus becomes the target's token at the root, one token a round.
        s["acc"] = torch.zeros_like(a)
        s["bonus"] = s["ttok"].view(B, N)[:, 0].to(s["bonus"].dtype)
        stages["kv_compact"]()
        stages["update"]()
    if int(e.gen.min()) != max_new:
        raise RuntimeError(f"forced_trace: generated counts {e.gen.tolist()}, expected {max_new} each")
    return {"paths": torch.stack(paths).numpy(), "acc": torch.stack(acc).numpy(),
            "scores": torch.stack(scores).numpy(), "tokens": e.out[:, :max_new].cpu().numpy()}


def save(path, meta, traces):
    """The .npz simulate.load reads: meta (batches, max_new, costs {batch: {budget: seconds}}, ...) and one
    forced_trace per entry of meta["batches"]."""
    if len(traces) != len(meta["batches"]):
        raise ValueError(f"save: {len(traces)} traces for batches {meta['batches']}")
    arrays = {f"g{i}_{k}": tr[k] for i, tr in enumerate(traces) for k in ("paths", "scores", "tokens")}
    np.savez_compressed(path, meta=json.dumps(meta), **arrays)


@torch.no_grad()
def round_costs(models, ops, prompts, *, budgets, max_new, top_k=8, device="cuda", dtype=torch.bfloat16,
                rounds=8):
    """Seconds of one round at each budget for a batch of len(prompts): the auto engine's calibration bursts
    (CUDA graphs, rounds back to back from the admitted prompts), the median of `rounds` rounds each."""
    target, drafter, cfg = models
    e = Engine(target, drafter, cfg, ops, mode="spec", batch_size=len(prompts),
               max_prompt=max(len(p) for p in prompts), max_new=max_new, budget="auto", top_k=top_k,
               device=device, dtype=dtype, auto_budgets=budgets)
    e.admit(prompts)
    e.capture()
    e.calibrate(rounds=rounds)
    return e.costs.row(len(prompts))


@torch.no_grad()
def text_check(models, ops, prompts, tokens, *, budget, max_new, top_k=8, device="cuda", dtype=torch.bfloat16):
    """How many requests a plain fixed-budget decode writes exactly as the trace did (the simulation's
    premise: the text does not depend on the budget)."""
    target, drafter, cfg = models
    e = Engine(target, drafter, cfg, ops, mode="spec", batch_size=len(prompts),
               max_prompt=max(len(p) for p in prompts), max_new=max_new, budget=budget, top_k=top_k,
               device=device, dtype=dtype)
    out = np.asarray(e.generate(prompts).tokens)
    return int((out == tokens).all(1).sum())


def main(argv=None):
    from .run import throughput_groups
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the .npz to write")
    ap.add_argument("--preset", default="h200", choices=sorted(train.PRESETS))
    ap.add_argument("--batches", default="1,4,16,64", help="run.py's batch sizes (their prompt sets)")
    ap.add_argument("--batch1-prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--prompt-lens", default="32,224")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--weights", default="float32", choices=["float32", "bf16"],
                    help="the models' weights (cache and attention bf16 either way); float32: the budget-independent "
                         "text the simulation needs")
    ap.add_argument("--cost-budgets", default=",".join(map(str, COST_BUDGETS)))
    ap.add_argument("--check-budget", type=int, default=16, help="the fixed budget of the text check")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("trace: needs a CUDA device (kdtree's kernels)")
    device, dtype = torch.device("cuda"), torch.bfloat16
    lo, hi = (int(x) for x in a.prompt_lens.split(","))
    batches = [int(x) for x in a.batches.split(",")]
    cost_budgets = tuple(int(x) for x in a.cost_budgets.split(","))
    ops = load_backend("kdtree")
    target, drafter, cfg, info = train.get_models(a.preset, device, log=print)
    if a.weights == "bf16":
        target, drafter = target.to(torch.bfloat16), drafter.to(torch.bfloat16)
    models = (target, drafter, cfg)
    traces, meta = [], {"batches": batches, "max_new": a.max_new, "top_k": a.top_k, "weights": a.weights,
                        "trace_budget": TRACE_BUDGET, "costs": {}, "text_check": {}, "models": info}
    for B in batches:
        t0 = time.time()
        prompts = [p for group in throughput_groups(a.preset, B, a.batch1_prompts, lo, hi) for p in group]
        tr = forced_trace(models, ops, prompts, max_new=a.max_new, top_k=a.top_k, device=device, dtype=dtype)
        traces.append(tr)
        same = text_check(models, ops, prompts, tr["tokens"], budget=a.check_budget, max_new=a.max_new,
                          top_k=a.top_k, device=device, dtype=dtype)
        meta["text_check"][str(B)] = [same, len(prompts)]
        costs = round_costs(models, ops, prompts[:B], budgets=cost_budgets, max_new=a.max_new, top_k=a.top_k,
                            device=device, dtype=dtype)
        meta["costs"][str(B)] = {str(b): s for b, s in costs.items()}
        print(f"batch {B}: traced {len(prompts)} requests x {a.max_new} tokens (budget-127 tok/round "
              f"{1 + tr['acc'].astype(float).mean():.2f}); text check at budget {a.check_budget}: {same}/{len(prompts)} "
              f"identical; round ms by budget {{{', '.join(f'{b}: {1e3 * s:.3f}' for b, s in costs.items())}}} "
              f"({time.time() - t0:.0f} s)", flush=True)
    save(a.out, meta, traces)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
