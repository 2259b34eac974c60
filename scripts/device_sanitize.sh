#!/usr/bin/env bash
# GPU tests under compute-sanitizer: memcheck (out-of-bounds and misaligned
# device accesses) and racecheck (shared-memory hazards), on representative
# cases of every operation (the full parity grids would take far longer under
# the tools). Runs over binaries carried in .carry/ (scripts/pack_device_carry.sh),
# like scripts/device_gpu_run.sh; logs go to $OUT. About 3 minutes on an H200.
# Exit: 0 clean, 1 a finding or a failed test, 77 no GPU here (nothing was run).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"

if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "device_sanitize: no GPU here (nvidia-smi -L failed): nothing was checked" >&2
  exit 77
fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
            /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ -z "$sanitizer" ]; then
  echo "device_sanitize: compute-sanitizer not found (PATH, /usr/local/cuda/bin): nothing was checked" >&2
  exit 1
fi
tests=$carry/bin/kdtree_gpu_tests
[ -x "$tests" ] || { echo "device_sanitize: $tests is missing (scripts/pack_device_carry.sh)" >&2; exit 1; }

# One or two cases per operation: the error cases drive every bounds check next to a
# well-formed request, so both the valid path and the guards run under the tools.
cases=(
  "verify_attention GPU: a page id out of range*"
  "verify_attention GPU: a node count over W*"
  "verify_attention GPU: kv_len over max_kv_len*"
  "verify_attention GPU parity: wgmma stream-K with one and with a few CTAs"
  "verify_attention GPU parity: wgmma e4m3 stream-K with one and with a few CTAs"
  "tree_build GPU: small candidate trees*"
  "tree_build GPU: all-equal and -inf*"
  "tree_accept GPU: malformed requests*"
  "tree_accept GPU: node_indptr past total_nodes*"
  "tree_allocate GPU: random batches*"
  "tree_allocate GPU: a NaN or increasing score*"
  "sample_tokens GPU: greedy ties*"
  "sample_tokens GPU: random logits*"
  "kv_compact GPU: path*in place*"
  "kv_compact GPU: malformed requests*"
  "kv_compact GPU: a path longer than one read-then-write round"
)
filter=$(IFS=,; echo "${cases[*]}")

"$sanitizer" --version | tail -1
status=0
for tool in memcheck racecheck; do
  start=$(date +%s)
  log=$out/sanitize_$tool.log
  "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 50 \
    "$tests" -tc="$filter" > "$log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test cases:" "$log" | tr '\n' ' ')
  echo "== $tool: exit $rc in $(( $(date +%s) - start )) s: $summary"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "^========= (Invalid|Error|Race|.*hazard)|FAILED|ERROR:" "$log" | head -20
  fi
  # A filter that matched nothing would pass vacuously: insist every case ran.
  ran=$(grep -oE "test cases: *[0-9]+ \| *[0-9]+ passed" "$log" | grep -oE "[0-9]+" | head -1)
  if [ "${ran:-0}" -ne ${#cases[@]} ]; then
    echo "device_sanitize: $tool ran ${ran:-0} test cases, expected ${#cases[@]}" >&2
    status=1
  fi
done
exit $status
