#!/usr/bin/env bash
# budget "auto" (kdtree.integrations.budget) against every fixed budget on the DDTree example's model, on the
# GPU machine; about 5-6 minutes (the time limits below stop each step):
#   1. warms kdtree's kernels for the example's shapes in the background (mla576/512, widths 16..128, page 64),
#   2. python -m examples.ddtree.run --budget auto --auto-reps 5: trains (or loads) the models, then tokens/s of AR,
#      of every fixed budget (15, 16, 31, 32, 63, 64, 127; 2, 3, 4, 6, 8 from batch 16) and of auto at batch 1
#      (8 prompts one at a time), 4, 16 and 64, CUDA graphs, 128 new tokens; then auto and the two best fixed budgets of that sweep
#      again, 5 times in alternation (each the best of 2 runs per prompt group), compared by medians: the line
#      "auto / best fixed (budget N), medians: R" per batch, and in the speedup table (a single run of each is
#      within the run-to-run noise, which reached 15% at batch 64),
#   3. examples/ddtree/trace.py over the same models and prompts ($OUT/trace.npz: `python -m
#      examples.ddtree.simulate trace.npz` replays budget policies over it on any machine),
#   4. the GPU tests of the auto path: prefix_tree over kdtree's tree_build (what the counterfactual counts rest
#      on), auto with graphs at batch 64.
# It runs this checkout's Python (python/kdtree, examples/) over the installed (or carried .whl) package's
# native library, so a wheel built before these Python changes still measures them. Arguments go to run.py:
# `--throughput-weights float32` decodes with float32 weights (bf16 cache and attention), whose greedy text
# did not depend on the budget, so auto and the fixed budgets compare on the same text (examples/ddtree/README.md).
# Output in $OUT (default /tmp/kdtree-auto-out): auto.txt, auto.json, trace.npz, trace.txt, pytest_auto.txt, warm.txt.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
OUT=${OUT:-/tmp/kdtree-auto-out}
mkdir -p "$OUT"
source "$root/scripts/kdtree_wheel.sh"  # kdtree importable, the shared cubin cache, training allowed
native=$(python3 -c "import kdtree._loader as l; print(l.library_path()); print(l.kdtree_gen_path())") || {
  echo "device_auto_budget: kdtree is not importable (run scripts/device_python.sh, or carry .whl/kdtree-*.whl)" >&2
  exit 2
}
export KDTREE_LIBRARY=$(sed -n 1p <<<"$native") KDTREE_GEN=$(sed -n 2p <<<"$native")
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import torch, kdtree.integrations.budget as b; assert hasattr(b, 'AutoBudget'); assert torch.cuda.is_available(), 'no CUDA device'; print('kdtree from', b.__file__, 'library', '$KDTREE_LIBRARY')"; then
  echo "device_auto_budget: needs torch with a CUDA device and this checkout's kdtree Python package" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
t_start=$SECONDS

python3 -m kdtree warm --arch native --heads mla576/512 --widths 16,32,64,128 --pages 64 --dtypes bf16 -j 8 \
  >"$OUT/warm.txt" 2>&1 &
warm_pid=$!

status=0
echo "== DDTree example: budget auto vs every fixed budget at batch 1, 4, 16, 64 (then 5 alternating repetitions)"
timeout 360 python3 -m examples.ddtree.run --budget auto --auto-reps 5 --batches 1,4,16,64 --max-new 128 \
  --batch1-prompts 8 --skip greedy,sampling,acceptance,ops,bad_input --json "$OUT/auto.json" "$@" 2>&1 | tee "$OUT/auto.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "run.py failed"; status=1; }
echo "run.py: $((SECONDS - t_start)) s"
wait "$warm_pid" || echo "kdtree warm exited non-zero (see warm.txt)"

echo "== teacher-forced trace of the same models and prompts (examples/ddtree/trace.py), for simulate.py"
timeout 150 python3 -m examples.ddtree.trace --out "$OUT/trace.npz" 2>&1 | tail -6 | tee "$OUT/trace.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "trace.py failed"; status=1; }

echo "== GPU tests of the auto path"
timeout 90 python3 -m pytest -q -s -rs -p no:cacheprovider tests/python/test_ddtree_gpu.py \
  -k "prefix_tree or auto_budget" 2>&1 | tee "$OUT/pytest_auto.txt"
[[ ${PIPESTATUS[0]} -ne 0 ]] && { echo "pytest failed"; status=1; }
echo "total: $((SECONDS - t_start)) s"
exit $status
