"""Host time per call of the Python package, against the C ABI.

For each operation, on shapes small enough that the GPU never holds the host back (the same shapes as
bench_host_overhead.cpp), it times:
  function   kdtree.<op>(...)            the plain function (argument checks, output allocation, launch)
  operator   torch.ops.kdtree.<op>(...)  the same through torch's dispatcher
  ctypes     the bare ctypes call with a prebuilt argument struct (a lower bound for any ctypes binding)
and, with --cpp PATH (bench_host_overhead), the C ABI called from C++. Calls run in batches of 100; the
stream is drained between batches outside the timed region; the median batch time / 100 is reported.
Prints a table and writes JSON to --json (default $OUT/python_overhead.json when $OUT is set).

--cpu-stub times the Python part alone, on any machine: CPU tensors, the C library replaced by a C
function that does nothing (libc's abs, called through ctypes with the same argument types), and torch's
CUDA queries (stream, current device, capture) by constants. "ctypes" is then the bare stubbed call, so
function - ctypes is what the package adds in Python (checks, allocation, struct filling).

usage: python bench/python_overhead.py [--cpp build/bench_host_overhead] [--batches 50] [--json FILE] [--cpu-stub]
                                      [--primitives]
"""

import argparse
import contextlib
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import kdtree
from kdtree import _checks, _kv_compact, _launch, _lib
from kdtree._verify_attention import check as verify_check, workspace_size

PER_BATCH = 100
# Host us above the C ABI each path may add (issue 15): the plain functions, and torch.ops.kdtree.*.
TARGET_FUNCTION_US = 10.0
TARGET_OPERATOR_US = 15.0


def host_us(fn, batches, sync=torch.cuda.synchronize):
    for _ in range(20):
        fn()
    samples = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(PER_BATCH):
            fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3 / PER_BATCH)
    sync()
    return statistics.median(samples)


class _NoEvent:
    def record(self):
        pass

    def query(self):
        return True


def stub_cuda():
    """--cpu-stub: every C entry point a no-op C function, torch's CUDA queries constants, CPU accepted as
    the device. Only for timing: nothing runs on a GPU and the results are never read."""
    libc = ctypes.CDLL(None)

    class Api:
        pass

    api = Api()
    for name, struct in (("verify_attention", _lib.VerifyArgs), ("tree_build", _lib.TreeBuildArgs),
                         ("tree_accept", _lib.TreeAcceptArgs), ("sample_tokens", _lib.SampleArgs),
                         ("kv_compact", _lib.KvCompactArgs)):
        f = libc["abs"]  # a fresh function pointer per name; abs(0) == 0 == KDTREE_OK (runtime handle 0)
        f.restype, f.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(struct)]
        setattr(api, name, f)

    def workspace_size(rt, spec, batch, nodes, max_kv_len, out):
        out._obj.value = 1 << 16
        return 0

    api.verify_workspace_size = workspace_size
    _lib.api = api
    _checks.ACCEPT_CPU = True  # CPU tensors pass the device checks (fast and full)
    _launch.runtime = lambda index: 0
    _launch.current_stream = lambda index: 0
    _launch.device_guard = lambda index: contextlib.nullcontext()
    _launch.capturing = lambda: False
    _launch._get_device = lambda: -1  # the CPU tensors' get_device(): the launch's device is current
    torch.cuda.Event = _NoEvent
    torch.Tensor.pin_memory = lambda self: self


def cases(dev="cuda"):
    i32 = dict(dtype=torch.int32, device=dev)
    out = {}

    # verify_attention: MLA, 16 heads, W=16, page 64, one request of 16 nodes over 64 prefix tokens.
    nodes, page = 16, 64
    q = torch.zeros(nodes, 16, 576, dtype=torch.bfloat16, device=dev)
    k = torch.zeros(2, page, 1, 576, dtype=torch.bfloat16, device=dev)
    table = torch.tensor([[0, 1]], **i32)
    lens = torch.tensor([64 + nodes], **i32)
    indptr = torch.tensor([0, nodes], **i32)
    mask = torch.tensor([[(1 << (i + 1)) - 1] for i in range(nodes)], dtype=torch.int64, device=dev)
    ws_bytes = workspace_size(verify_check(q, k, None, table, lens, indptr, mask, 16))
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=dev)
    o = torch.empty(nodes, 16, 512, dtype=torch.bfloat16, device=dev)
    a = _lib.VerifyArgs()
    a.spec = _lib.VerifySpec(576, 512, 16, 1, page, 16, _lib.DTYPE_BF16)
    a.batch_size, a.total_nodes, a.max_kv_len, a.num_pages = 1, nodes, 2 * page, 2
    a.q, a.node_indptr, a.k_cache, a.page_table = q.data_ptr(), indptr.data_ptr(), k.data_ptr(), table.data_ptr()
    a.max_pages_per_req, a.kv_lens, a.tree_mask = 2, lens.data_ptr(), mask.data_ptr()
    a.sm_scale, a.out = 0.0416667, o.data_ptr()
    a.workspace, a.workspace_size = (ws.data_ptr() if ws_bytes else None), ws_bytes
    a.stream = _launch.current_stream(0)
    rt = _launch.runtime(0)
    out["verify_attention"] = (
        lambda: kdtree.verify_attention(q, k, table, lens, indptr, mask, max_tree_nodes=16),
        lambda: torch.ops.kdtree.verify_attention(q, k, None, table, lens, indptr, mask, 16),
        lambda: _lib.api.verify_attention(rt, ctypes.byref(a)))

    B, W = 4, 16
    # tree_build: B=4, D=4, K=4, budget 15, W=16.
    tb_in = (torch.zeros(B, 4, 4, **i32), torch.zeros(B, 4, 4, dtype=torch.float32, device=dev), torch.zeros(B, **i32),
             torch.zeros(B, **i32))
    tb_out = [torch.empty(B, W, **i32) for _ in range(8)] + [torch.empty(B, W, dtype=torch.int64, device=dev)]
    tba = _lib.TreeBuildArgs(B, 4, 4, 15, W, *(t.data_ptr() for t in tb_in), *(t.data_ptr() for t in tb_out[:-1]),
                             stream=a.stream)
    out["tree_build"] = (
        lambda: kdtree.tree_build(*tb_in, budget=15, max_tree_nodes=W),
        lambda: torch.ops.kdtree.tree_build(*tb_in, 15, W),
        lambda: _lib.api.tree_build(rt, ctypes.byref(tba)))
    tb_res = kdtree.tree_build(*tb_in, budget=15, max_tree_nodes=W)
    out["tree_build out="] = (  # into caller-owned outputs: no allocation
        lambda: kdtree.tree_build(*tb_in, budget=15, max_tree_nodes=W, out=tb_res),
        lambda: torch.ops.kdtree.tree_build_out(*tb_in, 15, W, *tb_res),
        lambda: _lib.api.tree_build(rt, ctypes.byref(tba)))

    # tree_accept: B=4, W=16, chains whose every token the target accepts.
    tokens = torch.ones(B, W, **i32)
    parents = (torch.arange(W, **i32) - 1).expand(B, W).contiguous()
    counts = torch.full((B,), W, **i32)
    targets = torch.ones(B, W, **i32)
    path, acc, bonus = (torch.empty(B, W, **i32), torch.empty(B, **i32), torch.empty(B, **i32))
    ta = _lib.TreeAcceptArgs(batch_size=B, max_tree_nodes=W, tokens=tokens.data_ptr(), parents=parents.data_ptr(),
                             node_counts=counts.data_ptr(), target_tokens=targets.data_ptr(),
                             accepted_path=path.data_ptr(), accept_lens=acc.data_ptr(), bonus_tokens=bonus.data_ptr(),
                             stream=a.stream)
    out["tree_accept"] = (
        lambda: kdtree.tree_accept(tokens, parents, counts, targets),
        lambda: torch.ops.kdtree.tree_accept(tokens, parents, counts, targets, None),
        lambda: _lib.api.tree_accept(rt, ctypes.byref(ta)))

    # sample_tokens: 4 rows x 1000 f32, T = 0.8.
    logits = torch.zeros(4, 1000, device=dev)
    sampled = torch.empty(4, **i32)
    sa = _lib.SampleArgs(num_rows=4, vocab_size=1000, logits_dtype=_lib.DTYPE_F32, logits=logits.data_ptr(),
                         temperature=0.8, seed=1, out_tokens=sampled.data_ptr(), stream=a.stream)
    out["sample_tokens"] = (
        lambda: kdtree.sample_tokens(logits, temperature=0.8, seed=1),
        lambda: torch.ops.kdtree.sample_tokens(logits, 0.8, 1, None),
        lambda: _lib.api.sample_tokens(rt, ctypes.byref(sa)))

    # kv_compact: MLA, 2 layers of [2, 64, 1, 576], B=1, W=16, path [0, 2].
    caches = [torch.zeros(2, page, 1, 576, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    kv_lens = torch.tensor([64 + W], **i32)
    kv_counts = torch.tensor([W], **i32)
    kv_path = torch.full((1, W), -1, **i32)
    kv_path[0, :2] = torch.tensor([0, 2], **i32)
    kv_acc = torch.tensor([1], **i32)
    kdtree.kv_compact(caches, table, kv_lens, kv_counts, kv_path, kv_acc)  # builds the pointer table
    ptrs = _kv_compact._pointer_table("k_caches", caches, False, 0 if dev == "cuda" else -1, a.stream)
    ka = _lib.KvCompactArgs(num_layers=2, batch_size=1, max_tree_nodes=W, page_size=page, num_pages=2,
                            row_elems_k=576, dtype=_lib.DTYPE_BF16, k_caches=ptrs,
                            page_table=table.data_ptr(), max_pages_per_req=2, kv_lens=kv_lens.data_ptr(),
                            node_counts=kv_counts.data_ptr(), accepted_path=kv_path.data_ptr(),
                            accept_lens=kv_acc.data_ptr(), stream=a.stream)
    out["kv_compact"] = (
        lambda: kdtree.kv_compact(caches, table, kv_lens, kv_counts, kv_path, kv_acc),
        lambda: torch.ops.kdtree.kv_compact(caches, [], table, kv_lens, kv_counts, kv_path, kv_acc, False),
        lambda: _lib.api.kv_compact(rt, ctypes.byref(ka)))
    return out


def primitives(dev, batches, sync):
    """Host us of the torch calls the launch path makes (to attribute what is left of the overhead)."""
    from kdtree import _plan_cache
    t = torch.zeros(16, 16, 576, dtype=torch.bfloat16, device=dev)
    six = (t, t, t, t, t, t)
    out = {
        "torch.empty_strided": lambda: torch.empty_strided((16, 16, 512), (8192, 512, 1), dtype=torch.bfloat16, device=dev),
        "package allocator": lambda: _launch.empty_fn(0 if dev == "cuda" else -1)((16, 16, 512), (8192, 512, 1), torch.bfloat16),
        "plan-cache find (6 tensors)": None,
        "current device": _launch._get_device,
        "current raw stream": lambda: _launch.current_stream(0),
        "capturing": _launch.capturing,
        "data_ptr": t.data_ptr,
    }
    cache = _plan_cache.PlanCache()
    cache.add(1, six, "plan")
    out["plan-cache find (6 tensors)"] = lambda: cache.find(1, six)
    return {name: host_us(fn, batches, sync) for name, fn in out.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpp", help="bench_host_overhead binary (the C ABI from C++)")
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--primitives", action="store_true", help="also time the torch calls the launch path makes")
    ap.add_argument("--cpu-stub", action="store_true", help="time the Python part on CPU, the C calls stubbed")
    ap.add_argument("--json", default=os.path.join(os.environ["OUT"], "python_overhead.json") if os.environ.get("OUT") else None)
    args = ap.parse_args()
    sync, dev, where = torch.cuda.synchronize, "cuda", None
    if args.cpu_stub:
        stub_cuda()
        sync, dev, where = (lambda: None), "cpu", "CPU, C calls stubbed (ctypes = the bare stub call)"
    elif not torch.cuda.is_available():
        print("python_overhead: no CUDA GPU visible to torch, nothing to time (--cpu-stub times the Python part)")
        return 0
    c_abi = {}
    if args.cpp:
        res = subprocess.run([args.cpp, "--batches", str(args.batches)], capture_output=True, text=True, check=True)
        for line in res.stdout.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                c_abi[rec["op"]] = rec["c_abi_us"]
    rows = []
    for op, (function, operator, raw) in cases(dev).items():
        rec = {"op": op, "function_us": host_us(function, args.batches, sync),
               "operator_us": host_us(operator, args.batches, sync), "ctypes_us": host_us(raw, args.batches, sync)}
        if args.cpu_stub:
            rec["python_us"] = rec["function_us"] - rec["ctypes_us"]
            rec["operator_python_us"] = rec["operator_us"] - rec["ctypes_us"]
        if op in c_abi:
            rec["c_abi_us"] = c_abi[op]
            rec["function_overhead_us"] = rec["function_us"] - c_abi[op]
            rec["operator_overhead_us"] = rec["operator_us"] - c_abi[op]
            rec["function_within_target"] = rec["function_overhead_us"] <= TARGET_FUNCTION_US
            rec["operator_within_target"] = rec["operator_overhead_us"] <= TARGET_OPERATOR_US
        rows.append(rec)
    print(f"host us per call (median of {args.batches} batches of {PER_BATCH}); torch {torch.__version__}, "
          f"{where or torch.cuda.get_device_name(0)}")
    print(f"targets above the C ABI: function <= {TARGET_FUNCTION_US:g} us, operator <= {TARGET_OPERATOR_US:g} us"
          + ("" if c_abi else " (fn - C / op - C need --cpp; with --cpu-stub, fn - ct and op - ct are the Python part)"))
    print(f"{'op':<18}{'function':>10}{'operator':>10}{'ctypes':>10}{'C ABI':>10}{'fn - C':>10}{'op - C':>10}"
          f"{'fn - ct':>10}{'op - ct':>10}")
    for r in rows:
        def f(key, target=None):
            if key not in r:
                return f"{'-':>10}"
            flag = "" if target is None else (" " if r[key] <= target else "!")  # ! = above its target
            return f"{r[key]:{10 - len(flag)}.2f}{flag}"
        print(f"{r['op']:<18}{f('function_us')}{f('operator_us')}{f('ctypes_us')}{f('c_abi_us')}"
              f"{f('function_overhead_us', TARGET_FUNCTION_US)}{f('operator_overhead_us', TARGET_OPERATOR_US)}"
              f"{f('python_us', TARGET_FUNCTION_US)}{f('operator_python_us', TARGET_OPERATOR_US)}")
    if args.primitives:
        prims = primitives(dev, args.batches, sync)
        for name, us in prims.items():
            print(f"  {name:<30}{us:8.2f} us")
        rows.append({"primitives_us": prims})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
