#!/usr/bin/env bash
# e4m3 KV caches on the GPU machine (docs/PERFORMANCE.md, "e4m3 KV caches: two paths"), over binaries carried in
# .carry/ (scripts/pack_device_carry.sh); about 8 minutes (each step has a time limit):
#   1. the GPU parity cases of the e4m3 MMA path (every head with mma=e4m3; sm_120's MLA tiles) and the whole
#      GPU suite,
#   2. bench_verify: bf16, e4m3 with the default tiles (sm_90: dequantising), e4m3 on the e4m3 MMA path,
#      sm_120's MLA e4m3 kernel (qsplit) and the flash MLA e4m3 kernel,
#   3. compute-sanitizer racecheck and memcheck on e4m3 MMA cases,
#   4. the DDTree example over an e4m3 cache (greedy equality, sampling TV, throughput), dequantising and on
#      the e4m3 MMA path (needs torch and this checkout's Python: scripts/kdtree_wheel.sh).
# Output in $OUT (default /tmp/kdtree-fp8-out).
set -uo pipefail
device_out=/tmp/kdtree-fp8-out
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
flash_mla=kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=16,mma=e4m3  # sm_120's before qsplit had the path
t0=$SECONDS
status=0

timeout 240 "$carry/bin/kdtree_gpu_tests" -tc="*e4m3 MMA*" >"$out/gpu_e4m3_mma.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR" "$out/gpu_e4m3_mma.log" | head -20
timeout 300 "$carry/bin/kdtree_gpu_tests" >"$out/gpu_all.log" 2>&1 || status=1
grep -E "parity \[|test cases|ERROR" "$out/gpu_all.log" | head -30
echo "tests: $((SECONDS - t0)) s"

bench() {  # name, kv dtype, tiles, extra args
  KDTREE_VERIFY_TILES=$3 timeout 100 "$carry/bin/bench_verify" --kv-dtype "$2" ${4:-} --json "$out/bench_$1.json" \
    >"$out/bench_$1.txt" 2>&1 || status=1
  echo "== bench $1"; grep -vE '^\{' "$out/bench_$1.txt" | tail -11
}
bench bf16 as_q ""
bench e4m3_default e4m3 ""
bench e4m3_mma e4m3 mma=e4m3
bench e4m3_sm120_mla e4m3 "$sm120_mla" "--shape mla"
bench e4m3_flash_mla e4m3 "$flash_mla" "--shape mla"

for tool in racecheck memcheck; do
  KDTREE_VERIFY_TILES=$sm120_mla timeout 90 compute-sanitizer --tool $tool "$carry/bin/kdtree_gpu_tests" \
    -tc="*sm_120's tiles*" --case 'verify_attention[mla576/512,W=16,page=16*' >"$out/$tool.log" 2>&1
  echo "$tool: $(grep -E 'SUMMARY' "$out/$tool.log")"
done

export PYTHONPATH=$root/python KDTREE_LIBRARY=$carry/lib/libkdtree.so.0 KDTREE_GEN=$carry/bin/kdtree-gen
source "$root/scripts/kdtree_wheel.sh"
for path in dequantising e4m3_mma; do
  tiles=""; [[ $path == e4m3_mma ]] && tiles=$sm120_mla
  KDTREE_VERIFY_TILES=$tiles timeout 280 python3 -m examples.ddtree.run --kv-dtype e4m3 --batches 1,16 \
    --budgets 32,64 --max-new 128 --skip speedup,ops,bad_input --json "$out/ddtree_$path.json" \
    >"$out/ddtree_$path.txt" 2>&1 || status=1
  echo "== DDTree, e4m3 cache, $path"; grep -E "^identical|TV|DDTree budget" "$out/ddtree_$path.txt" | head -16
done
echo "total: $((SECONDS - t0)) s"
exit $status
