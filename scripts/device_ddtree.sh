#!/usr/bin/env bash
# DDTree speculative decoding end to end on the GPU machine (examples/ddtree/README.md), about 4-5 minutes (the time limits below stop it by 7):
#   1. compiles kdtree's kernels for the example's shapes in the background (kdtree-gen warm),
#   2. python -m examples.ddtree.run: trains the target + drafter (~2.5 min, fixed seeds; or loads
#      them from $KDTREE_DDTREE_CACHE), greedy equality, the sampling TV test, acceptance lengths,
#      tokens/s vs autoregressive at batch 1 (8 prompts, one at a time)/4/16/64 (CUDA graphs; budgets
#      4..127, 4 and 8 at batches >= 16) and the per-op breakdown of every batch,
#   3. the GPU tests tests/python/test_ddtree_gpu.py (load the cached weights).
# Needs: torch with CUDA and an importable kdtree package (scripts/device_python.sh installs it;
# or the carried wheel .whl/kdtree-*.whl is installed into /tmp/site). Output under $OUT (default /tmp/kdtree-ddtree-out):
# ddtree.txt, ddtree.json, pytest_ddtree.txt, warm.txt.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/kdtree-ddtree-out}
mkdir -p "$OUT"
# kdtree importable, the shared cubin cache and its trained weights (unless KDTREE_DDTREE_CACHE says
# otherwise): scripts/kdtree_wheel.sh.
source "$root/scripts/kdtree_wheel.sh"
if ! python3 -c "import kdtree, torch; assert torch.cuda.is_available(), 'no CUDA device'"; then
  echo "device_ddtree: needs torch with a CUDA device and the kdtree package (run scripts/device_python.sh first)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

echo "== warming kdtree's kernels for the example (background, log in \$OUT/warm.txt)"
python3 -m kdtree warm --arch native --heads mla576/512 --widths 16,32,64,128 --pages 64 --dtypes bf16 -j 8 \
  >"$OUT/warm.txt" 2>&1 &
warm_pid=$!

status=0
echo "== python -m examples.ddtree.run"
timeout 320 python3 -m examples.ddtree.run --json "$OUT/ddtree.json" "$@" 2>&1 | tee "$OUT/ddtree.txt"
rc=${PIPESTATUS[0]}
[[ $rc -ne 0 ]] && { echo "run.py exited with $rc"; status=1; }
wait "$warm_pid" || echo "kdtree warm exited non-zero (see warm.txt); kernels compile at first use instead"
tail -n 2 "$OUT/warm.txt"

echo "== GPU tests"
timeout 90 python3 -m pytest -q -s -rs tests/python/test_ddtree_gpu.py 2>&1 | tee "$OUT/pytest_ddtree.txt"
rc=${PIPESTATUS[0]}
[[ $rc -ne 0 ]] && { echo "pytest exited with $rc"; status=1; }
exit $status
