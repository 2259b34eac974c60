#!/usr/bin/env bash
# The full device pass: every GPU test, the example and the benchmarks (default
# tiles), then the verify parity tests and the MLA benchmark under sm_120's tile
# choices (the kernel source is the same on every arch; only tiles differ).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
status=0
bash scripts/device_gpu_run.sh all || status=1
# sm_120's MLA kernel (kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32) has its own parity test case in the run above.
# block_m=32,block_n=16,warps=4,stages=3,warp_rows=16 (two column warps of 16 rows; the MLA
# fallback after it) applies to MLA only: gqa64 cannot be split over two column warps and the
# override is rejected there. block_m=64,block_n=32,warps=4,stages=2,warp_rows=16 is sm_120's
# gqa256 choice and valid for every head. sm_80's MLA tiles (2 x 4 warps of 32 rows) run on the H200 too.
for run in "kernel=flash,block_m=32,block_n=16,warps=4,stages=3,warp_rows=16 *parity: mla576/512" \
  "kernel=flash,block_m=64,block_n=32,warps=8,stages=2,warp_rows=32 *parity: mla576/512" \
  "kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16 verify*"; do
  tiles=${run%% *}
  filter=${run#* }
  echo "== tiles $tiles on the H200 ($filter)"
  KDTREE_VERIFY_TILES=$tiles "$carry/bin/kdtree_gpu_tests" -tc="$filter" > "$out/gpu_tests_tiles_${tiles//[,=]/_}.log" 2>&1 || status=1
  grep -E "parity|test cases" "$out/gpu_tests_tiles_${tiles//[,=]/_}.log"
done
echo "== MLA benchmark with sm_120's kernel (kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32)"
KDTREE_VERIFY_TILES=kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32 "$carry/bin/bench_verify" --shape mla --iters 20 | tail -n +2 | tee "$out/bench_verify_sm120_tiles.txt"
exit $status
