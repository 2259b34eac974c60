#!/usr/bin/env python3
"""Performance model of verify_attention from the kernels' SASS (docs/PERFORMANCE.md,
"Performance model").

  perf_model.py predict  --arch sm_120 [--tiles kernel=K,block_m=M,...] [--json FILE] [--compile-arch ARCH] [--splits N]
                         [--schedule stream|splits|cluster]
  perf_model.py validate --measured BENCH_OUTPUT [--arch sm_90] [--tiles ...] [--column graph_us] [--max-error 20]
                         [--schedule stream|splits|cluster]
  perf_model.py grid     [--arch sm_120]          SASS counts and spills of the whole verify_attention grid
  perf_model.py check    --baseline tools/perf_model/baseline_sm120.json [--update] [--tolerance 0.10]
                         (the CI guard: grid spills, then bench shapes' predicted sm_120 times vs the baseline)

Kernels and launch plans come from build/verify_plan (the runtime's planner and
code generator; --plan-tool overrides the path); --tiles sets KDTREE_VERIFY_TILES
for it, as on the GPU. BENCH_OUTPUT is bench_verify's printed table or its --json
file. Needs nvdisasm and cuobjdump (pip install nvidia-cuda-nvdisasm
nvidia-cuda-cuobjdump); no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kernel as kernel_mod  # noqa: E402
from model import Model  # noqa: E402
from rates import rates_for  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kv_elem_bytes(plan: dict) -> int:
    """Bytes of a cached K/V element: 1 for e4m3 caches (verify_plan's "kv_dtype"), else 2."""
    return 1 if plan.get("kv_dtype") == "e4m3" else 2


def unmodelled(plan: dict) -> None:
    """Stops with a clear message on a family the simulation does not model: the wgmma
    family's warpgroup MMAs (HGMMA, sm_90a) run asynchronously beside the warps, which
    the per-warp issue model cannot represent; docs/PERFORMANCE.md has its ncu reading."""
    if plan.get("family") == "wgmma":
        raise SystemExit("perf_model: the wgmma family (sm_90's MLA default for 16-bit caches) is not modelled; "
                         "model the portable kernel with --tiles kernel=flash,warp_rows=32, and see "
                         "docs/PERFORMANCE.md (Hopper: the wgmma family) for what binds the wgmma kernel")


def copies_per_thread(plan: dict) -> int:
    """16-byte cp.async copies per thread and KV tile (templates/verify_attention_common.cuh:
    ROW_LANES lanes per token row, 8, or 16 when a pass of 8-lane rows is taller than the
    tile; rows strided by threads / ROW_LANES)."""
    threads = plan["warps"] * 32
    row_lanes = 16 if threads // 8 > plan["block_n"] else 8
    rows_per_pass = threads // row_lanes
    passes = -(-plan["block_n"] // rows_per_pass)
    kvb = kv_elem_bytes(plan)
    k_chunks = plan["head_qk"] * kvb // 16
    v_chunks = 0 if plan["head_qk"] == 576 else plan["head_v"] * kvb // 16
    # K and V rows are copied by the same lanes, each its own loop (load_kv_tile).
    return passes * (-(-k_chunks // row_lanes) + -(-v_chunks // row_lanes))


def warp_roles(plan: dict) -> int:
    """Warp rows that run different steady paths: the qsplit kernel's two skewed rows."""
    return 2 if plan.get("family") == "qsplit" else 1


def entry(plan: dict) -> str:
    """The main kernel's entry a plan launches: its cluster twin when the splits merge in a cluster."""
    return "kdtree_verify_attention_cluster" if plan.get("cluster_splits", 0) > 1 else "kdtree_verify_attention"


def load(arch: str, tiles: str | None, plan_tool: str, cache_dir: str | None, shape: str | None,
         compile_arch: str | None = None, splits: int | None = None,
         kv_dtype: str | None = None, schedule: str | None = None) -> list[tuple[dict, kernel_mod.Kernel]]:
    env = dict(os.environ)
    env.pop("KDTREE_VERIFY_TILES", None)
    env.pop("KDTREE_VERIFY_SCHEDULE", None)
    if tiles:
        env["KDTREE_VERIFY_TILES"] = tiles
    if schedule:
        env["KDTREE_VERIFY_SCHEDULE"] = schedule
    with tempfile.TemporaryDirectory(prefix="kdtree-perf-") as out:
        cmd = [plan_tool, "--arch", arch, "--cubin-dir", out]
        if cache_dir:
            cmd += ["--cache-dir", cache_dir]
        if shape:
            cmd += ["--shape", shape]
        if compile_arch:
            cmd += ["--compile-arch", compile_arch]
        if splits:
            cmd += ["--splits", str(splits)]
        if kv_dtype:
            cmd += ["--kv-dtype", kv_dtype]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"perf_model: {' '.join(cmd)} failed:\n{res.stderr}")
        plans = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
        kernels: dict[str, kernel_mod.Kernel] = {}
        result = []
        for plan in plans:
            name = plan["kernel"]
            unmodelled(plan)
            function = entry(plan)
            if (name, function) not in kernels:
                with open(os.path.join(out, name + ".log")) as f:
                    log_text = f.read()
                kernels[name, function] = kernel_mod.analyse(os.path.join(out, name + ".cubin"), copies_per_thread(plan),
                                                             log_text, warp_roles(plan), function)
            result.append((plan, kernels[name, function]))
        return result


def grid_kernels(args, arch: str) -> list[tuple[dict, kernel_mod.Kernel]]:
    """Every verify_attention kernel of the default grid for the arch (verify_plan --grid)."""
    env = dict(os.environ)
    env.pop("KDTREE_VERIFY_TILES", None)
    with tempfile.TemporaryDirectory(prefix="kdtree-perf-grid-") as out:
        cmd = [args.plan_tool, "--arch", arch, "--grid", "-j", str(args.jobs), "--cubin-dir", out]
        if args.cache_dir:
            cmd += ["--cache-dir", args.cache_dir]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"perf_model: {' '.join(cmd)} failed:\n{res.stderr}")
        result = []
        for line in res.stdout.splitlines():
            if not line.startswith("{"):
                continue
            plan = json.loads(line)
            unmodelled(plan)
            with open(os.path.join(out, plan["kernel"] + ".log")) as f:
                log_text = f.read()
            # Each entry of the cubin: the main kernel, and its cluster twin where it has one.
            for function in ["kdtree_verify_attention"] + (["kdtree_verify_attention_cluster"]
                                                           if plan.get("cluster_merge") else []):
                result.append((plan, kernel_mod.analyse(os.path.join(out, plan["kernel"] + ".cubin"),
                                                        copies_per_thread(plan), log_text, warp_roles(plan), function)))
        return result


def check_grid(args, arch: str) -> int:
    """SASS counts of the grid's kernels; 1 when any spills."""
    status = 0
    print(f"{'kernel':58} {'regs':>4} {'instr':>5} {'HMMA':>4} {'LDSM':>4} {'cp.async':>8} {'smem B':>7}  spills")
    for plan, k in grid_kernels(args, arch):
        c = k.counts
        ldsm = sum(v for n, v in c.items() if n.startswith("LDSM"))
        spill = k.spill_instrs or k.spill_bytes > 0
        print(f"{k.name:58} {k.registers:4d} {c['total']:5d} {c.get('HMMA', 0):4d} {ldsm:4d} "
              f"{c.get('LDGSTS', 0):8d} {k.port_bytes_per_warp:7d}  "
              f"{'SPILLS: %d LDL/STL, %d bytes' % (k.spill_instrs, k.spill_bytes) if spill else 'none'}")
        if spill:
            status = 1
    return status


def cmd_grid(args) -> int:
    status = check_grid(args, args.arch)
    print("grid: " + ("spills found" if status else "no spills"))
    return status


def predictions(args, arch: str, tiles: str | None, compile_arch: str | None = None):
    rates = rates_for(compile_arch or arch)
    if args.clock_ghz:
        rates["clock_hz"] = args.clock_ghz * 1e9  # a measured clock (scripts/device_perf_model.sh samples it)
    model = Model(rates)
    items = load(arch, tiles, args.plan_tool, args.cache_dir, args.shape, compile_arch, getattr(args, "splits", None),
                 getattr(args, "kv_dtype", None), getattr(args, "schedule", None))
    return [(plan, k, model.predict(plan, k)) for plan, k in items]


def tiles_of(plan: dict) -> str:
    """The family and tiles as KDTREE_VERIFY_TILES spells them (verify_plan's "tiles")."""
    return plan["tiles"]


def plan_text(plan: dict) -> str:
    """The split plan: the split count, or sk<CTAs> for stream-K."""
    return f"sk{plan['stream_ctas']}" if plan.get("stream_ctas") else str(plan["splits"])


def print_predictions(rows, out=sys.stdout) -> None:
    print(f"{'shape':24} {'tiles':66} {'regs':>4} {'spill':>5} {'splits':>6} {'CTA/SM':>6} {'waves':>5} "
          f"{'tile clk':>8} {'tensor':>6} {'port':>5} {'issue':>5} {'L2':>5} {'us':>8} {'comb us':>7} {'TFLOP/s':>7}  binding",
          file=out)
    for plan, k, p in rows:
        print(f"{plan['shape']:24} {tiles_of(plan):66} {k.registers:4d} {max(k.spill_instrs, k.spill_bytes, 0):5d} "
              f"{plan_text(plan):>6} {p.ctas_per_sm:6d} {p.waves:5d} {p.tile_cycles:8.0f} {p.tensor_busy:6.0%} "
              f"{p.port_busy:5.0%} {p.issue_busy:5.0%} {p.l2_busy:5.0%} {p.us:8.1f} {p.combine_us:7.1f} {p.tflops:7.1f}  "
              f"{p.binding}", file=out)


def print_counts(rows, out=sys.stdout) -> None:
    seen = set()
    for plan, k, _ in rows:
        if k.name in seen:
            continue
        seen.add(k.name)
        c = dict(k.counts)
        total = c.pop("total")
        parts = ", ".join(f"{v} {n}" for n, v in sorted(c.items(), key=lambda kv: -kv[1]))
        print(f"{k.name}: per warp and KV tile {total} instructions: {parts}; "
              f"{k.port_bytes_per_warp} shared-memory bytes", file=out)


def read_measured(path: str, column: str, kv_dtype: str | None = None) -> dict[str, float]:
    """shape -> µs from bench_verify's table or its --json lines: the rows of kv_dtype (bench_verify names
    e4m3 rows "shape,e4m3")."""
    raw = read_measured_rows(path, column)
    suffix = ",e4m3"
    if kv_dtype == "e4m3":
        return {k[:-len(suffix)]: v for k, v in raw.items() if k.endswith(suffix)}
    return {k: v for k, v in raw.items() if not k.endswith(suffix)}


def read_measured_rows(path: str, column: str) -> dict[str, float]:
    measured: dict[str, float] = {}
    header = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("#"):
                continue
            if line.startswith("{"):
                obj = json.loads(line)
                measured[obj["shape"]] = float(obj[column])
                continue
            fields = line.split()
            if fields and fields[0] == "shape":
                header = fields
                continue
            if header and len(fields) >= len(header) - 2 and column in header:
                try:
                    measured[fields[0]] = float(fields[header.index(column)])
                except ValueError:
                    pass
    if not measured:
        raise SystemExit(f"perf_model: no '{column}' measurements in {path} (bench_verify output or --json file)")
    return measured


def cmd_predict(args) -> int:
    rows = predictions(args, args.arch, args.tiles, args.compile_arch)
    print_counts(rows)
    print_predictions(rows)
    if args.json:
        with open(args.json, "w") as f:
            for plan, k, p in rows:
                f.write(json.dumps({"shape": p.shape, "arch": p.arch, "tiles": tiles_of(plan), "us": round(p.us, 2),
                                    "binding": p.binding, "modelled": p.modelled, "tflops": round(p.tflops, 1),
                                    "registers": k.registers,
                                    "spills": max(k.spill_instrs, k.spill_bytes, 0)}) + "\n")
    return 0


def cmd_validate(args) -> int:
    measured = read_measured(args.measured, args.column, args.kv_dtype)
    rows = predictions(args, args.arch, args.tiles)
    print_counts(rows)
    print(f"{'shape':24} {'tiles':66} {'predicted us':>12} {'measured us':>11} {'error':>7}  binding")
    worst = 0.0
    missing, unmodelled_rows = [], []
    for plan, k, p in rows:
        if plan["shape"] not in measured:
            missing.append(plan["shape"])
            continue
        m = measured[plan["shape"]]
        err = (p.us - m) / m
        if p.modelled:
            worst = max(worst, abs(err))
        else:
            unmodelled_rows.append(plan["shape"])
        print(f"{plan['shape']:24} {tiles_of(plan):66} {p.us:12.1f} {m:11.1f} {err:+7.1%}  {p.binding}")
    if missing:
        print(f"not measured: {', '.join(missing)}")
    if unmodelled_rows:
        print(f"not modelled, so not in the worst error: {', '.join(unmodelled_rows)}")
    if len(missing) == len(rows):
        # (e4m3 rows are named "<shape>,e4m3", as bench_verify prints them)
        print(f"no predicted shape is in {args.measured} (--kv-dtype {args.kv_dtype or 'as_q'}): nothing validated")
        return 1
    if len(missing) + len(unmodelled_rows) == len(rows):
        print("no measured shape's kernel is modelled: nothing validated")
        return 1
    print(f"worst error {worst:.1%} (limit {args.max_error:.0f}%)")
    return 1 if worst * 100 > args.max_error else 0


# The baseline's sections: the bench shapes' predicted sm_120 times with 16-bit and with e4m3 caches.
BASELINE_KEYS = {"as_q": "predicted_us", "e4m3": "predicted_us_e4m3"}


def cmd_check(args) -> int:
    status = check_grid(args, "sm_120")
    current = {}
    for kv, key in BASELINE_KEYS.items():
        args.kv_dtype = kv
        rows = predictions(args, "sm_120", None)
        print_predictions(rows)
        for plan, k, _ in rows:
            if k.spill_instrs or k.spill_bytes > 0:
                print(f"FAIL {k.name}: spills ({k.spill_instrs} LDL/STL, {k.spill_bytes} bytes by ptxas)")
                status = 1
        current[key] = {p.shape: round(p.us, 2) for _, _, p in rows}
    if args.update:
        with open(args.baseline, "w") as f:
            json.dump({"arch": "sm_120", **current}, f, indent=1, sort_keys=True)
            f.write("\n")
        print(f"baseline written: {args.baseline}")
        return status
    with open(args.baseline) as f:
        baseline = json.load(f)
    for key, shapes in current.items():
        status |= check_against(shapes, baseline.get(key, {}), args.tolerance, key)
    print("perf_model check: " + ("FAILED" if status else "ok"))
    return status


def check_against(current: dict, base: dict, tolerance: float, key: str) -> int:
    status = 0
    for shape, us in sorted(current.items()):
        if shape not in base:
            print(f"note {shape}: no baseline (run with --update to record it)")
            continue
        ratio = us / base[shape]
        if ratio > 1 + tolerance:
            print(f"FAIL {shape} ({key}): predicted {us:.1f} us on the RTX PRO 6000, baseline {base[shape]:.1f} us "
                  f"({ratio - 1:+.1%}, limit +{tolerance:.0%})")
            status = 1
    return status


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan-tool", default=os.path.join(ROOT, "build", "verify_plan"))
    ap.add_argument("--cache-dir", default=None, help="kdtree cubin cache for verify_plan (default: its default)")
    ap.add_argument("--shape", default=None, help="only shapes with this name prefix")
    ap.add_argument("--jobs", type=int, default=2, help="compile threads for the grid")
    ap.add_argument("--clock-ghz", type=float, default=None, help="SM clock to model instead of the arch's")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--arch", required=True)
    p.add_argument("--tiles")
    p.add_argument("--json")
    p.add_argument("--splits", type=int, help="what-if: force the KV split count")
    p.add_argument("--kv-dtype", choices=["as_q", "e4m3"], help="the KV caches' dtype (default as_q: 16-bit)")
    p.add_argument("--schedule", choices=["stream", "splits", "cluster"],
                   help="what-if: KDTREE_VERIFY_SCHEDULE for the planner (cluster: splits merged in a cluster)")
    p.add_argument("--compile-arch", help="what-if: --arch's tiles and plan, compiled for and run on this arch "
                                          "(shared-memory limits of --arch)")
    v = sub.add_parser("validate")
    v.add_argument("--measured", required=True)
    v.add_argument("--arch", default="sm_90")
    v.add_argument("--tiles")
    v.add_argument("--column", default="graph_us", choices=["us", "b2b_us", "graph_us"])
    v.add_argument("--max-error", type=float, default=20.0)
    v.add_argument("--kv-dtype", choices=["as_q", "e4m3"], help="the KV caches' dtype (default as_q: 16-bit)")
    v.add_argument("--schedule", choices=["stream", "splits", "cluster"],
                   help="KDTREE_VERIFY_SCHEDULE the measurement ran with")
    g = sub.add_parser("grid", help="SASS counts and spills of every verify_attention kernel of the default grid")
    g.add_argument("--arch", default="sm_120")
    c = sub.add_parser("check")
    c.add_argument("--baseline", default=os.path.join(ROOT, "tools", "perf_model", "baseline_sm120.json"))
    c.add_argument("--update", action="store_true")
    c.add_argument("--tolerance", type=float, default=0.10)
    args = ap.parse_args()
    if not os.access(args.plan_tool, os.X_OK):
        raise SystemExit(f"perf_model: {args.plan_tool} not found: build the project first (scripts/build.sh)")
    return {"predict": cmd_predict, "validate": cmd_validate, "grid": cmd_grid, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
