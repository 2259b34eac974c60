#!/usr/bin/env bash
# sm_120's GQA tile candidates (docs/PERFORMANCE.md, "sm_120: GQA tiles at the measured tensor rate") on the H200,
# over binaries carried in .carry/ (scripts/pack_device_carry.sh); about 5 minutes:
#   1. their GPU parity cases (8 warps of 16 rows; 16-bit and the e4m3 MMA path),
#   2. bench_verify of each GQA shape with sm_120's tiles of today and with the candidates, both cache types:
#      the model's H200 rows at those tiles. Back here, for each file $OUT/bench_<head>_<dtype>_<which>.txt:
#        python3 tools/perf_model/perf_model.py --shape <head> validate --arch sm_90 [--kv-dtype e4m3] \
#          --tiles <its tiles, printed at its top> --measured <file>
#      The generator may take the candidates for sm_120 once every row is within the model's ±10%.
# Output in $OUT (default /tmp/kdtree-gqa-tiles-out).
set -uo pipefail
device_out=/tmp/kdtree-gqa-tiles-out
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
status=0

timeout 300 "$carry/bin/kdtree_gpu_tests" -tc="*candidate tiles*" >"$out/gpu_candidates.log" 2>&1 || status=1
grep -E "parity \[|test cases|assertions|Status|ERROR|FAILED" "$out/gpu_candidates.log" | head -30

# head dtype which tiles
while read -r head dtype which tiles; do
  file=$out/bench_${head}_${dtype}_${which}.txt
  echo "# $head $dtype $which: tiles $tiles" | tee "$file"
  KDTREE_VERIFY_TILES=$tiles timeout 100 "$carry/bin/bench_verify" --iters 20 --kv-dtype "$dtype" --shape "$head" |
    tee -a "$file" || status=1
done <<'ROWS'
gqa64 as_q today kernel=flash,block_m=128,block_n=64,warps=4,stages=2,warp_rows=32
gqa64 as_q candidate kernel=flash,block_m=128,block_n=32,warps=8,stages=4,warp_rows=16
gqa128 as_q today kernel=flash,block_m=128,block_n=32,warps=4,stages=3,warp_rows=32
gqa128 as_q candidate kernel=flash,block_m=128,block_n=64,warps=8,stages=2,warp_rows=16
gqa256 as_q today kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16
gqa256 as_q candidate kernel=flash,block_m=128,block_n=16,warps=8,stages=2,warp_rows=16
gqa64 e4m3 today kernel=flash,block_m=128,block_n=64,warps=4,stages=3,warp_rows=32,mma=e4m3
gqa64 e4m3 candidate kernel=flash,block_m=128,block_n=32,warps=8,stages=3,warp_rows=16,mma=e4m3
gqa128 e4m3 today kernel=flash,block_m=128,block_n=32,warps=4,stages=3,warp_rows=32,mma=e4m3
gqa128 e4m3 candidate kernel=flash,block_m=64,block_n=32,warps=4,stages=2,warp_rows=16,mma=e4m3
gqa256 e4m3 today kernel=flash,block_m=64,block_n=64,warps=4,stages=2,warp_rows=16,mma=e4m3
gqa256 e4m3 candidate kernel=flash,block_m=128,block_n=32,warps=8,stages=3,warp_rows=16,mma=e4m3
ROWS
echo "device_gqa_tiles: $((SECONDS)) s, status $status"
exit $status
