#!/usr/bin/env bash
# Splits merged in a thread-block cluster (KDTREE_VERIFY_SCHEDULE=cluster; docs/PERFORMANCE.md, "sm_120: what
# binds", and "Hopper: the wgmma family") on the GPU machine, over binaries carried in .carry/
# (scripts/pack_device_carry.sh). Three sections, each within the device's 10 minutes a call (one call
# each: `device_cluster.sh tests`, `... bench`, `... sanitize`; no argument runs all three):
#   1. the GPU cases of the cluster entries: the MLA parity grid with cluster plans on sm_120's e4m3 kernel
#      and on sm_90's MLA wgmma kernels (16-bit and e4m3 caches), every cluster size 2..8 on uneven requests,
#      bad pages and node counts; then the kernels' usual (stream-K / partials) cases, which must be unchanged,
#   2. bench_verify: on sm_120's e4m3 kernel the MLA shapes with the usual plans, with cluster plans, and the
#      bytes-bound shape at 2..5 splits each way (the perf model's validation rows for the cluster merge:
#      tools/perf_model/perf_model.py validate --arch sm_90 --kv-dtype e4m3 --tiles $sm120_mla --schedule cluster);
#      on sm_90's own MLA kernels (wgmma, both cache types) the MLA shapes usual and clustered, and the
#      bytes-bound shape at 2..4 splits each way,
#   3. compute-sanitizer racecheck and memcheck on cluster cases of both kernels,
#   4. (section dsmem, not in the default set) bench/dsmem/dsmem_rates.cu built with nvcc for the GPU's own
#      arch: the cluster barrier, remote-load latency and remote read rate the perf model charges for the merge
#      (on an RTX PRO 6000 this measures what the sm_120 model assumes from Hopper).
# Output in $OUT (default /tmp/kdtree-cluster-out).
set -uo pipefail
device_out=/tmp/kdtree-cluster-out
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
t0=$SECONDS
status=0
sections=${*:-tests bench sanitize}
has() { [[ " $sections " == *" $1 "* ]]; }

if has tests; then
timeout 180 "$carry/bin/kdtree_gpu_tests" -tc="*cluster*" >"$out/gpu_cluster.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR|not run" "$out/gpu_cluster.log" | head -20
timeout 120 "$carry/bin/kdtree_gpu_tests" -tc="*sm_120's tiles*" >"$out/gpu_qsplit_e4m3.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR" "$out/gpu_qsplit_e4m3.log" | head -10
timeout 280 "$carry/bin/kdtree_gpu_tests" -tc="*mla576/512","*wgmma*" -tce="*cluster*" >"$out/gpu_wgmma.log" 2>&1 ||
  status=1
grep -E "parity \[|test cases|ERROR" "$out/gpu_wgmma.log" | head -10
echo "tests: $((SECONDS - t0)) s"
fi

bench() {  # name, schedule, extra args, tiles (default: sm_120's MLA e4m3 kernel; "" the GPU's own)
  KDTREE_VERIFY_TILES=${4-$sm120_mla} KDTREE_VERIFY_SCHEDULE=$2 timeout 100 "$carry/bin/bench_verify" \
    ${3:-} --json "$out/bench_$1.json" >"$out/bench_$1.txt" 2>&1 || status=1
  echo "== bench $1"; grep -vE '^\{' "$out/bench_$1.txt" | tail -9
}
if has bench; then
bench usual "" "--kv-dtype e4m3 --shape mla"
bench cluster cluster "--kv-dtype e4m3 --shape mla"
for s in 2 3 4 5; do
  bench "b64_splits${s}" splits "--kv-dtype e4m3 --shape mla_b64 --splits $s"
  bench "b64_cluster${s}" cluster "--kv-dtype e4m3 --shape mla_b64 --splits $s"
done
for kv in as_q e4m3; do
  bench "wgmma_${kv}_usual" "" "--kv-dtype $kv --shape mla" ""
  bench "wgmma_${kv}_cluster" cluster "--kv-dtype $kv --shape mla" ""
  for s in 2 3 4; do
    bench "wgmma_${kv}_b64_splits${s}" splits "--kv-dtype $kv --shape mla_b64 --splits $s" ""
    bench "wgmma_${kv}_b64_cluster${s}" cluster "--kv-dtype $kv --shape mla_b64 --splits $s" ""
  done
done
echo "bench: $((SECONDS - t0)) s"
fi

# The sessions of these cases set their own tiles and schedule.
if has sanitize; then
for family in qsplit wgmma; do
  for tool in racecheck memcheck; do
    timeout 150 compute-sanitizer --tool $tool "$carry/bin/kdtree_gpu_tests" \
      -tc="*$family*cluster merge? 2..8 splits*" >"$out/${tool}_$family.log" 2>&1
    echo "$tool $family: $(grep -E 'SUMMARY' "$out/${tool}_$family.log")"
  done
done
fi
if has dsmem; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)  # 90, 120: sm_90a, sm_120a
  nvcc -O3 -std=c++17 -arch="sm_${cc}a" bench/dsmem/dsmem_rates.cu -o "$out/dsmem_rates" && "$out/dsmem_rates" | tee "$out/dsmem.txt" ||
    status=1
  rm -f "$out/dsmem_rates"
fi
echo "total: $((SECONDS - t0)) s"
exit $status
