"""Throughput (tokens per second) and the per-op time of a step, both with CUDA graphs."""
from __future__ import annotations

import statistics

import torch

from .engine import Engine


def throughput(models, ops, groups, *, mode, max_new, budget=63, top_k=8, graphs=True, device="cuda",
               dtype=torch.bfloat16, repeats=2, kv_dtype=None, kv_scale=1.0, alloc="request"):
    """Decodes `groups` (batches of prompts, all of one size) one after another on one engine (one
    CUDA graph), max_new tokens for every prompt; each batch's time is the best of `repeats` runs
    after one untimed warm run of the first. tokens/s = all tokens / the sum of those times, so a
    batch of 1 over several prompts is not the figure of one prompt. Also returns each request's
    tokens/step (its own steps: the accepted draft tokens + 1, averaged over the steps it was active)."""
    graphs = graphs and torch.device(device).type == "cuda"
    target, drafter, cfg = models
    B = len(groups[0])
    if any(len(g) != B for g in groups):
        raise ValueError(f"every group must have {B} prompts, got sizes {[len(g) for g in groups]}")
    e = Engine(target, drafter, cfg, ops, mode=mode, batch_size=B, max_prompt=max(len(p) for g in groups for p in g),
               max_new=max_new, budget=budget, top_k=top_k, device=device, dtype=dtype, kv_dtype=kv_dtype,
               kv_scale=kv_scale, alloc=alloc)
    e.admit(groups[0])
    graph_error = None
    if graphs:
        try:
            e.capture()
        except Exception as ex:  # noqa: BLE001 - measured eagerly instead, and the row says so
            graph_error = f"{type(ex).__name__}: {ex}"
            e.graph = None
            torch.cuda.synchronize()
            e.admit(groups[0])
    e.generate(groups[0])  # warm: cuBLAS heuristics, kdtree's cubins, the allocator
    out = measure(e, groups, repeats=repeats)
    out.update(cuda_graph=graphs and graph_error is None, graph_error=graph_error)
    return out


def measure(e: Engine, groups, *, repeats=2):
    """throughput's numbers of an engine already built, captured and warmed (throughput's "engine"): decodes
    `groups` again, each batch's time the best of `repeats` runs (so measurements of several engines can
    alternate)."""
    B = e.B
    seconds, steps, acc, per_request, used = 0.0, 0, [], [], []
    for prompts in groups:  # admit() refills the captured graph's buffers in place: one graph serves all
        best = None
        for _ in range(repeats):
            r = e.generate(prompts)
            if best is None or r.seconds < best.seconds:
                best = r
        seconds += best.seconds
        steps += best.steps
        acc += [a for row in best.accept_lens for a in row if a >= 0]
        used += best.budgets or []
        for b in range(B):
            mine = [row[b] for row in best.accept_lens if row[b] >= 0]
            per_request.append(sum(a + 1 for a in mine) / len(mine) if mine else 1.0)
    tokens = len(groups) * B * e.max_new
    budget = ("auto" if e.auto else e.budget) if e.mode == "spec" else None
    return {"mode": e.mode, "batch": B, "groups": len(groups), "budget": budget,
            "tokens_per_s": tokens / seconds, "seconds": seconds, "steps": steps, "step_ms": 1e3 * seconds / steps,
            # mean over (request, step) pairs while the request was active: the acceptance figure
            "tokens_per_step": (sum(a + 1 for a in acc) / len(acc)) if acc else 1.0,
            # tokens per request per batch step: the batch waits for its slowest request (and up to 2
            # steps for the host to see it done), so tokens/s = B x this / step time exactly
            "batch_tokens_per_step": len(groups) * e.max_new / steps,
            "request_tokens_per_step": per_request, "accept_lens": acc,
            "cuda_graph": e.graph is not None or e.graphs is not None, "graph_error": None,
            # budget "auto": the budget of every step, and the measured step cost (ms) by candidate budget
            "budgets_used": used,
            "costs_ms": ({b: round(1e3 * t, 4) for b, t in e.costs.row(B).items()} if e.auto else None),
            # and the policy's estimate of the batch's tokens per request and step by budget (1 + a(n)): beside
            # the fixed budgets' measured tokens/step it tells a choice's acceptance side from its cost side
            "estimated_tokens_per_step": _estimates(e),
            "engine": e}


def _estimates(e: Engine):
    a = e.autob.policy.estimates() if e.auto else None
    return None if a is None else {b: round(1.0 + float(x), 3) for b, x in zip(e.budgets, a)}


def alternate(engines, groups, *, reps, repeats=2):
    """tokens/s of each engine ({name: engine}, built and warmed) over `groups`, `reps` times, the engines taken
    in turn and in reverse order every other repetition (so a drift of the machine's speed favours none).
    Returns {name: [tokens/s of each repetition]}."""
    names = list(engines)
    out = {n: [] for n in names}
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(measure(engines[n], groups, repeats=repeats)["tokens_per_s"])
    return out


def op_breakdown(engine: Engine, prompts, steps=24):
    """Milliseconds per step of each stage, from one CUDA graph per stage replayed in order, and of
    verify_attention alone (all layers, the step's shapes). On a CPU: host time of each eager stage."""
    if engine.device.type != "cuda":
        return _op_breakdown_eager(engine, prompts, steps)
    engine.admit(prompts)
    graphs = engine.stage_graphs()
    engine.admit(prompts)
    times = {name: [] for name, _ in graphs}
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(len(graphs) + 1)]
    for _ in range(steps):
        ev[0].record()
        for i, (_, g) in enumerate(graphs):
            g.replay()
            ev[i + 1].record()
        torch.cuda.synchronize()
        for i, (name, _) in enumerate(graphs):
            times[name].append(ev[i].elapsed_time(ev[i + 1]))
    out = {name: statistics.median(v) for name, v in times.items()}
    out["verify_attention (all layers)"] = _verify_only(engine)
    return out


def _verify_only(engine: Engine, repeats=20):
    s, cfg = engine.s, engine.cfg
    n_rows = engine.B * engine.N
    q = torch.randn(n_rows, cfg.n_heads, cfg.row_dim, device=engine.device, dtype=engine.dtype)
    mask = (s["tree"].tree_mask[:, : engine.N].reshape(n_rows, engine.MW) if engine.mode == "spec" else s["mask"])

    def run():
        for layer in range(cfg.n_layers):
            engine.ops.verify_attention(q, engine.cache.layer(layer), engine.page_table, s["kv_total"], engine.indptr,
                                        mask, max_tree_nodes=engine.W, sm_scale=cfg.sm_scale,
                                        max_kv_len=engine.M * engine.page_size)

    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(repeats):
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


@torch.no_grad()
def _op_breakdown_eager(engine: Engine, prompts, steps):
    import time
    engine.admit(prompts)
    stages = engine.stages()
    times = {name: [] for name, _ in stages}
    for _ in range(steps):
        for name, f in stages:
            t = time.perf_counter()
            f()
            times[name].append(1e3 * (time.perf_counter() - t))
    return {name: statistics.median(v) for name, v in times.items()}
