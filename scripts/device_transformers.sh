#!/usr/bin/env bash
# DDTree on transformers models through kdtree, on the GPU machine (docs/TRANSFORMERS.md); under 8 minutes
# (the time limits below stop each step):
#   1. warms kdtree's kernels for these shapes in the background (mla576/512, gqa128, widths 16..128, page 64, bf16),
#   2. tests/python/test_transformers_gpu.py: trains (or loads) the DeepSeek-V3- and Qwen3-architecture models
#      (~30 s each), greedy DDTree == generate() (float32 model + bf16 cache, and all bf16), SDPA reference and
#      auto budget, the sampling TV test,
#   3. examples.ddtree.hf_bench: tokens/s of generate() / kdtree AR / DDTree (fixed and auto budget) / DDTree
#      verified by SDPA over a dense mask, batch 1 and 8, and the per-stage split of a round,
#   4. examples.ddtree.hf_bench --auto-check: budget auto against every fixed budget it chooses among (DEFAULT_BUDGETS) on
#      both models at batch 1 and 8, then against the two best of them 5 times in alternation, compared by
#      medians ("auto / best fixed (budget N), medians: R"). (The DDTree example's auto comparison:
#      scripts/device_auto_budget.sh.)
# Needs: torch with CUDA, transformers 5.x and kdtree (importable, or the carried .whl/kdtree-*.whl, installed
# into /tmp/site as scripts/device_python.sh does). Output in $OUT (default /tmp/kdtree-transformers-out):
# pytest_transformers.txt, hf_bench.txt/.json, hf_auto.txt/.json, warm.txt, timings.txt.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/kdtree-transformers-out}
mkdir -p "$OUT"
source "$root/scripts/kdtree_wheel.sh"  # kdtree importable, the shared cubin cache, training allowed
if ! python3 -c "import kdtree, transformers, torch; assert torch.cuda.is_available(), 'no CUDA device'; print('transformers', transformers.__version__, 'torch', torch.__version__)"; then
  echo "device_transformers: needs torch with a CUDA device, transformers 5.x and kdtree" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
t_start=$SECONDS
stamp() { echo "$1: $((SECONDS - t_start)) s" | tee -a "$OUT/timings.txt"; }
: > "$OUT/timings.txt"

python3 -m kdtree warm --arch native --heads mla576/512,gqa128 --widths 16,32,64,128 --pages 64 --dtypes bf16 -j 8 \
  >"$OUT/warm.txt" 2>&1 &
warm_pid=$!

status=0
echo "== GPU equality tests (DeepSeek-V3 MLA, Qwen3 GQA)"
timeout 170 python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_transformers_gpu.py 2>&1 \
  | tee "$OUT/pytest_transformers.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "pytest failed"; status=1; }
stamp "tests"

echo "== transformers benchmark: generate() vs kdtree DDTree vs SDPA dense-mask verification, batch 1 and 8"
timeout 110 python3 -m examples.ddtree.hf_bench --presets deepseek-small,qwen3-small --batches 1,8 --max-new 128 \
  --json "$OUT/hf_bench.json" 2>&1 | tee "$OUT/hf_bench.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "hf_bench failed"; status=1; }
stamp "hf_bench"
wait "$warm_pid" || echo "kdtree warm exited non-zero (see warm.txt)"

echo "== transformers models: budget auto vs every fixed budget, then 5 alternating repetitions, batch 1 and 8"
timeout 190 python3 -m examples.ddtree.hf_bench --auto-check --reps 5 --presets deepseek-small,qwen3-small \
  --batches 1,8 --max-new 128 --json "$OUT/hf_auto.json" 2>&1 | tee "$OUT/hf_auto.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "hf_bench --auto-check failed"; status=1; }
stamp "hf auto check"
exit $status
