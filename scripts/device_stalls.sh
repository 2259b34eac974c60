#!/usr/bin/env bash
# Stall reasons and pipe use of the verify_attention main kernel (ncu metrics).
# Usage: bash scripts/device_stalls.sh SHAPE [KV_DTYPE [SOURCES.csv.gz]]   (KV_DTYPE as_q, the default, or e4m3)
# With SOURCES, also the stall samples per SASS instruction (ncu's SourceCounters section, its source page as
# gzipped CSV) for tools/stall_sources.py to summarise here.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
m=sm__cycles_elapsed.avg,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
m=$m,smsp__inst_executed_op_ldsm.sum,sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active
for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
         dispatch_stall lg_throttle no_instruction branch_resolving drain misc; do
  m=$m,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
"$ncu" --clock-control none -k regex:kdtree_verify_attention --launch-skip 6 -c 1 --metrics "$m" \
  "$carry/bin/bench_verify" --shape "$1" --kv-dtype "${2:-as_q}" --iters 2 2>&1 | grep -E "^\s+(sm|smsp|l1tex)__" 
if [ -n "${3:-}" ]; then
  dir=$(mktemp -d)
  rep=$dir/sources
  "$ncu" --clock-control none --section SourceCounters --section WarpStateStats -k regex:'^kdtree_verify_attention$' \
    --launch-skip 6 -c 1 --import-source no -o "$rep" -f \
    "$carry/bin/bench_verify" --shape "$1" --kv-dtype "${2:-as_q}" --iters 2 > /dev/null 2>&1
  "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass | gzip > "$3"
  rm -rf "$dir"
  echo "per-instruction stalls in $3 (python3 tools/stall_sources.py $3 --windows)"
fi
