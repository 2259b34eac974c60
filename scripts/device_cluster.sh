#!/usr/bin/env bash
# Splits merged in a thread-block cluster (KDTREE_VERIFY_SCHEDULE=cluster; docs/PERFORMANCE.md, "sm_120: what
# binds") on the GPU machine, over binaries carried in .carry/ (scripts/pack_device_carry.sh); about 4 minutes:
#   1. the GPU cases of the cluster entry: the MLA parity grid on sm_120's e4m3 kernel with cluster plans,
#      every cluster size 2..8 on uneven requests, bad pages and node counts; then the same kernel's usual
#      (stream-K / partials) cases, which must be unchanged,
#   2. bench_verify on that kernel: the MLA shapes with the usual plans, with cluster plans, and the
#      bytes-bound shape at 2..5 splits each way (the perf model's validation rows for the cluster merge:
#      tools/perf_model/perf_model.py validate --arch sm_90 --kv-dtype e4m3 --tiles $sm120_mla --schedule cluster),
#   3. compute-sanitizer racecheck and memcheck on cluster cases.
# Output in $OUT (default /tmp/kdtree-cluster-out).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
carry=$root/.carry
out=${OUT:-/tmp/kdtree-cluster-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KDTREE_CACHE_DIR=${KDTREE_CACHE_DIR:-/tmp/kdtree-cache}
sm120_mla=kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3
t0=$SECONDS
status=0

timeout 200 "$carry/bin/kdtree_gpu_tests" -tc="*cluster*" >"$out/gpu_cluster.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR|not run" "$out/gpu_cluster.log" | head -20
timeout 200 "$carry/bin/kdtree_gpu_tests" -tc="*sm_120's tiles*" >"$out/gpu_qsplit_e4m3.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR" "$out/gpu_qsplit_e4m3.log" | head -10
echo "tests: $((SECONDS - t0)) s"

bench() {  # name, schedule, extra args
  KDTREE_VERIFY_TILES=$sm120_mla KDTREE_VERIFY_SCHEDULE=$2 timeout 100 "$carry/bin/bench_verify" --kv-dtype e4m3 \
    ${3:-} --json "$out/bench_$1.json" >"$out/bench_$1.txt" 2>&1 || status=1
  echo "== bench $1"; grep -vE '^\{' "$out/bench_$1.txt" | tail -9
}
bench usual "" "--shape mla"
bench cluster cluster "--shape mla"
for s in 2 3 4 5; do
  bench "b64_splits${s}" splits "--shape mla_b64 --splits $s"
  bench "b64_cluster${s}" cluster "--shape mla_b64 --splits $s"
done

for tool in racecheck memcheck; do
  KDTREE_VERIFY_TILES=$sm120_mla KDTREE_VERIFY_SCHEDULE=cluster timeout 120 compute-sanitizer --tool $tool \
    "$carry/bin/kdtree_gpu_tests" -tc="*cluster merge, 2..8 splits*" >"$out/$tool.log" 2>&1
  echo "$tool: $(grep -E 'SUMMARY' "$out/$tool.log")"
done
echo "total: $((SECONDS - t0)) s"
exit $status
