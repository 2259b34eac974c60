#!/usr/bin/env bash
# Runs on a GPU machine over binaries built elsewhere and carried in .carry/
# (scripts/pack_device_carry.sh makes it): the GPU tests, the example and the
# benchmarks, with logs and JSON under $OUT. Usage: bash scripts/device_gpu_run.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"
"$carry/bin/kdtree-gen" info
status=0
if [ "$what" = all ] || [ "$what" = tests ]; then
  start=$(date +%s)
  "$carry/bin/kdtree_gpu_tests" ${GPU_TEST_ARGS:-} > "$out/gpu_tests.log" 2>&1 || status=1
  grep -E "parity:|test cases|assertions|Status|ERROR|FAILED|error" "$out/gpu_tests.log" | head -60
  echo "gpu tests: $(( $(date +%s) - start )) s"
  "$carry/bin/verify_mla" 2>&1 | tee "$out/example.log" | tail -12 || status=1
  "$carry/bin/verify_step" > "$out/verify_step.log" 2>&1 || status=1
  tail -30 "$out/verify_step.log"
fi
if [ "$what" = all ] || [ "$what" = bench ]; then
  "$carry/bin/bench_verify" --json "$out/bench_verify.json" 2>&1 | tee "$out/bench_verify.txt"
  for b in bench_tree_build_accept bench_sample_compact; do
    [ -x "$carry/bin/$b" ] && "$carry/bin/$b" > "$out/$b.txt" 2>&1
    [ -f "$out/$b.txt" ] && grep -v '^{' "$out/$b.txt" | tail -40
  done
fi
if [ -d "$carry/sass" ]; then  # instruction mix of carried cubins
  for f in "$carry"/sass/*.cubin; do
    /usr/local/cuda/bin/cuobjdump -sass "$f" > "$out/$(basename "$f" .cubin).sass" 2>&1
    echo "== $(basename "$f"): $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' "$out/$(basename "$f" .cubin).sass") instructions"
    grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+' "$out/$(basename "$f" .cubin).sass" | awk '{print $NF}' |
      sort | uniq -c | sort -rn | head -14 | tr '\n' ' '; echo
  done
fi
exit $status
