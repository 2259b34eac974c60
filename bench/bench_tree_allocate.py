"""A DDTree round's batch-wide node allocation on the GPU: kdtree.tree_allocate (one kernel) against
kdtree.integrations.allocate (the same choice in torch ops: behind(), a stable argsort, counts, prefix sums
and the row map), each captured in a CUDA graph as the decoding loop runs it and timed over replays (CUDA
events, median of 7 runs of 200 replays). The scores are tree_build's (B requests, trees at the cap).

    python bench/bench_tree_allocate.py [--batches 4,16,64,256] [--json out.json]
"""
import argparse
import json
import statistics

import torch

import kdtree
from kdtree.integrations import torch_ops
from kdtree.integrations.allocate import URGENCY


def graph_us(fn, reps=200, runs=7):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()  # warm: compiles, allocates
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / reps)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="4,16,64,256")
    ap.add_argument("--json")
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"{torch.cuda.get_device_name()}: graph replay, µs per allocation")
    print(f"{'batch':>6} {'W':>4} {'cap':>4} {'total':>6} {'torch ops':>10} {'tree_allocate':>14} {'ratio':>6}")
    for B in (int(x) for x in a.batches.split(",")):
        for W, per in ((16, 4), (64, 8), (128, 31)):
            cap, total = W - 1, B * per
            D, K, V = 16, 8, 1000
            lp, tok = torch.log_softmax(torch.randn(B, D, V, generator=gen) * 3, -1).topk(K, -1)
            tree = kdtree.tree_build(tok.int().cuda(), lp.float().cuda(), torch.zeros(B, dtype=torch.int32).cuda(),
                                     torch.full((B,), 100, dtype=torch.int32).cuda(), budget=cap, max_tree_nodes=W)
            gen_count = torch.randint(0, 128, (B,), generator=gen, dtype=torch.int32).cuda()
            active = gen_count < 120
            kw = dict(total=total, cap=cap, active=active, urgency=URGENCY)
            # what the engine's round does: remaining = max_new - generated, then the allocation
            t_torch = graph_us(lambda: torch_ops.tree_allocate(tree.scores, remaining=128 - gen_count, **kw))
            t_kd = graph_us(lambda: kdtree.tree_allocate(tree.scores, remaining=128 - gen_count, **kw))
            got = kdtree.tree_allocate(tree.scores, remaining=128 - gen_count, **kw)
            want = torch_ops.tree_allocate(tree.scores, remaining=128 - gen_count, **kw)
            same = all(torch.equal(x, y) for x, y in zip(got, want))
            rows.append(dict(batch=B, width=W, cap=cap, total=total, torch_us=t_torch, kdtree_us=t_kd, same=same))
            print(f"{B:>6} {W:>4} {cap:>4} {total:>6} {t_torch:>10.1f} {t_kd:>14.1f} {t_torch / t_kd:>5.1f}x"
                  + ("" if same else "  DIFFERENT CHOICE"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not all(r["same"] for r in rows):
        raise SystemExit("bench_tree_allocate: kdtree.tree_allocate chose differently from allocate")


if __name__ == "__main__":
    main()
