#!/usr/bin/env bash
# The H200 measurements the performance model (tools/perf_model) is validated
# against: bench_verify with the default (sm_90) tiles and with sm_120's tiles
# through KDTREE_VERIFY_TILES, the SM clock sampled while they run, and the
# parity tests of the sm_120 tile sets. Runs on the GPU over .carry/
# (scripts/pack_device_carry.sh). Back here:
#   python3 tools/perf_model/perf_model.py --shape mla validate --measured $OUT/bench_default.txt --tiles kernel=flash,warp_rows=32
#   python3 tools/perf_model/perf_model.py --shape mla validate --measured $OUT/bench_sm120_mla.txt --tiles kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32
#   python3 tools/perf_model/perf_model.py --shape gqa64 validate --measured $OUT/bench_sm120_gqa64.txt --tiles kernel=flash,block_m=128,block_n=64,warps=4,stages=2,warp_rows=32
#   python3 tools/perf_model/perf_model.py --shape gqa256 validate --measured $OUT/bench_sm120_gqa256.txt --tiles kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16
#   python3 tools/perf_model/perf_model.py --shape mla validate --kv-dtype e4m3 --measured $OUT/bench_e4m3_sm120_mla.txt --tiles kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3
# (add --clock-ghz with the median of $OUT/sm_clock_mhz.txt / 1000 to use the measured clock).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
status=0
nvidia-smi --query-gpu=clocks.sm --format=csv,noheader,nounits -lms 100 > "$out/sm_clock_mhz.txt" 2>/dev/null &
sampler=$!
bench() {  # NAME TILES SHAPE [KV_DTYPE]
  echo "== bench_verify tiles=${2:-default} shape=${3:-all} kv=${4:-as_q}"
  KDTREE_VERIFY_TILES=$2 "$carry/bin/bench_verify" --iters 20 --kv-dtype ${4:-as_q} ${3:+--shape $3} |
    tee "$out/bench_$1.txt" || status=1
}
# The portable kernel (sm_90's defaults, the wgmma family, are not modelled); its MLA tiles (the GQA heads'
# flash tiles differ per head: tools/perf_model/measured/h200_default_tiles.txt names them).
bench default kernel=flash,warp_rows=32 mla
bench sm120_mla kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32 mla
bench sm120_gqa64 kernel=flash,block_m=128,block_n=64,warps=4,stages=2,warp_rows=32 gqa64
bench sm120_gqa256 kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16 gqa256
# e4m3 caches: sm_120's MLA kernel, the qsplit e4m3 MMA kernel
bench e4m3_sm120_mla kernel=qsplit,block_m=64,block_n=32,warps=8,stages=4,warp_rows=32,mma=e4m3 mla e4m3
kill "$sampler" 2>/dev/null
sort -n "$out/sm_clock_mhz.txt" | awk '{a[NR]=$1} END {if (NR) print "SM clock while benchmarking: median " a[int((NR+1)/2)] " MHz, min " a[1] ", max " a[NR] " (" NR " samples)"}' | tee "$out/sm_clock_summary.txt"
# Parity of the sm_120 tile sets that differ from the sm_90 ones (each applies to its head only;
# sm_120's MLA kernel, kernel=qsplit,block_m=64,block_n=16,warps=8,stages=4,warp_rows=32, has its own test case in every GPU test run).
for run in "kernel=flash,block_m=128,block_n=64,warps=4,stages=2,warp_rows=32 *parity: gqa64*" \
  "kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16 *parity: gqa256*"; do
  tiles=${run%% *}
  filter=${run#* }
  echo "== parity with tiles $tiles ($filter)"
  KDTREE_VERIFY_TILES=$tiles "$carry/bin/kdtree_gpu_tests" -tc="$filter" > "$out/parity_${tiles//[,=]/_}.log" 2>&1 || status=1
  grep -E "parity|test cases" "$out/parity_${tiles//[,=]/_}.log"
done
exit $status
