#!/usr/bin/env bash
# On the GPU machine: everything that checks and times tree_allocate (the batch-wide node allocation kernel)
# and the rounds that use it, over the binaries in .carry/ and the wheel in .whl/ (scripts/pack_device_carry.sh;
# pip wheel . -w .whl --no-deps --no-build-isolation), with this checkout's Python. About 6 minutes:
#   1. kdtree_gpu_tests' tree_allocate cases, then under compute-sanitizer memcheck and racecheck;
#   2. the Python GPU tests of the op and of the rounds that allocate or choose budgets (DDTree example,
#      transformers decoder; greedy equality included);
#   3. bench/bench_tree_allocate.py (the kernel against the same choice in torch ops, CUDA graphs);
# PYTEST_K narrows step 2's tests (a pytest -k expression). Logs in $OUT (default /tmp/kdtree-out). Exit 1 if a
# step failed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
status=0
step() { echo "== $1"; }

step "kdtree_gpu_tests: tree_allocate"
"$carry/bin/kdtree_gpu_tests" -tc="tree_allocate*" 2>&1 | tail -4 | tee "$out/gpu_tree_allocate.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
  "$sanitizer" --tool "$tool" --error-exitcode 3 "$carry/bin/kdtree_gpu_tests" \
    -tc="tree_allocate GPU: random batches*,tree_allocate GPU: a NaN*" > "$out/sanitize_allocate_$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases:" "$out/sanitize_allocate_$tool.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || status=1
done

source "$root/scripts/kdtree_wheel.sh"  # kdtree importable from the carried wheel, training allowed
native=$(python3 -c "import kdtree._loader as l; print(l.library_path()); print(l.kdtree_gen_path())") || exit 1
export KDTREE_LIBRARY=$(sed -n 1p <<<"$native") KDTREE_GEN=$(sed -n 2p <<<"$native")
export PYTHONPATH=$root/python:$root/tests/python:$root${PYTHONPATH:+:$PYTHONPATH}

step "Python GPU tests"
timeout 400 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_gpu_tree_ops.py tests/python/test_ddtree_gpu.py \
  tests/python/test_transformers_gpu.py -k "${PYTEST_K:-(allocate or allocation or auto_budget or greedy or agree) and not family}" \
  > "$out/pytest_allocate.txt" 2>&1
rc=$?
tail -5 "$out/pytest_allocate.txt"
[ $rc -eq 0 ] || status=1

step "bench_tree_allocate"
timeout 120 python3 bench/bench_tree_allocate.py --json "$out/bench_tree_allocate.json" 2>&1 | tee "$out/bench_tree_allocate.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
