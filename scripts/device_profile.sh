#!/usr/bin/env bash
# Nsight Compute profile of verify_attention for chosen bench shapes (device tool).
# Usage: bash scripts/device_profile.sh SHAPE [SHAPE...]
set -uo pipefail
carry=$PWD/.carry
out=${OUT:-/tmp/kdtree-out}
export LD_LIBRARY_PATH=$carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export KDTREE_CACHE_DIR=/tmp/kdtree-cache
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for shape in "$@"; do
  "$ncu" --clock-control none -k regex:kdtree_verify --launch-skip 10 -c 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats \
    "$carry/bin/bench_verify" --shape "$shape" --iters 3 > "$out/ncu_$shape.txt" 2>&1
  grep -E "kdtree_verify|Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Registers|Shared Memory|Bank|Achieved|Theoretical Occ" "$out/ncu_$shape.txt" | head -60
done
