#!/usr/bin/env bash
# CPU-only guard for the target GPU (tools/perf_model, docs/PERFORMANCE.md): the
# model's unit tests, then the SASS of every sm_120 verify_attention kernel of
# bench_verify's shapes is counted and simulated; fails on any register spill
# and on any shape whose predicted RTX PRO 6000 time is more than 10% above
# tools/perf_model/baseline_sm120.json. Needs the build (build/verify_plan) and
# installs the disassembler wheels (nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump)
# when nvdisasm is not found.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}
tools=$build/perf_model_tools
if ! command -v nvdisasm >/dev/null || ! command -v cuobjdump >/dev/null; then
  if ! ls "$tools"/nvidia/*/bin/nvdisasm >/dev/null 2>&1; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$tools" nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump ||
      python3 -m pip install --quiet --disable-pip-version-check --break-system-packages --target "$tools" \
        nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump
  fi
  bin=$(dirname "$(ls "$tools"/nvidia/*/bin/nvdisasm | head -1)")
  export PATH=$bin:$PATH
fi
python3 "$root/tools/perf_model/test_perf_model.py"
python3 "$root/tools/perf_model/perf_model.py" --plan-tool "$build/verify_plan" check
