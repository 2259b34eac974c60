"""Throughput (tokens per second) and the per-op time of a step, both with CUDA graphs."""
from __future__ import annotations

import statistics

import torch

from .engine import Engine


def throughput(models, ops, prompts, *, mode, max_new, budget=63, top_k=8, graphs=True, device="cuda",
               dtype=torch.bfloat16, repeats=2):
    """Generates max_new tokens for every prompt (after one untimed warm run); the best of `repeats`."""
    graphs = graphs and torch.device(device).type == "cuda"
    target, drafter, cfg = models
    e = Engine(target, drafter, cfg, ops, mode=mode, batch_size=len(prompts), max_prompt=max(map(len, prompts)),
               max_new=max_new, budget=budget, top_k=top_k, device=device, dtype=dtype)
    e.admit(prompts)
    if graphs:
        e.capture()
    e.generate(prompts)  # warm: cuBLAS heuristics, kdtree's cubins, the allocator
    best = None
    for _ in range(repeats):
        r = e.generate(prompts)
        if best is None or r.seconds < best.seconds:
            best = r
    tokens = len(prompts) * max_new
    acc = [a for row in best.accept_lens for a in row if a >= 0]
    return {"mode": mode, "batch": len(prompts), "budget": budget if mode == "spec" else None,
            "tokens_per_s": tokens / best.seconds, "steps": best.steps, "step_ms": 1e3 * best.seconds / best.steps,
            "tokens_per_step": (sum(a + 1 for a in acc) / len(acc)) if acc else 1.0, "accept_lens": acc,
            "engine": e}


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
