#!/usr/bin/env bash
# Tile sweep for verify_attention on the device: the benchmark under each
# KDTREE_VERIFY_TILES candidate (key=value, e.g. kernel=flash,block_m=64,block_n=32,stages=3).
# Usage: bash scripts/device_tile_sweep.sh PREFIX TILES...
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
prefix=$1
shift
for tiles in "$@"; do
  echo "== tiles $tiles"
  KDTREE_VERIFY_TILES=$tiles "$carry/bin/bench_verify" --shape "$prefix" --iters 20 | tail -n +3
done
