#!/usr/bin/env bash
# The CPU test suite under sanitizers (a CI step of its own, after scripts/test.sh):
#  1. AddressSanitizer + UndefinedBehaviorSanitizer: kdtree_tests (and the
#     kdtree-gen it runs), every test case except the full default-grid NVRTC
#     compile (minutes of NVRTC time, none of it instrumented), plus the
#     no-driver-link check on the sanitized libkdtree.so (no --as-needed here).
#  2. ThreadSanitizer: kdtree_thread_tests, the test cases that race threads or
#     processes on the cache and the runtime (a target of their own, so this
#     build compiles only what they need).
# -fno-sanitize-recover=all makes every finding fatal, so it fails the step.
# Build dirs: $KDTREE_SAN_BUILD_DIR (default build-san)/{asan,tsan}. Usage:
#   scripts/test_sanitizers.sh [asan|tsan|all]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
what=${1:-all}
base=${KDTREE_SAN_BUILD_DIR:-$root/build-san}
jobs=${KDTREE_JOBS:-2}
cuda=${CUDA_HOME:-/usr/local/cuda}
"$root/scripts/install_deps.sh"

# Configures $1 with sanitizer flags $2 and builds the targets after them.
build() {
  local dir=$1 flags=$2
  shift 2
  mkdir -p "$dir"
  local args=(-S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKDTREE_BUILD_EXAMPLES=OFF
              "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_C_FLAGS=$flags"
              "-DCMAKE_EXE_LINKER_FLAGS=$flags" "-DCMAKE_SHARED_LINKER_FLAGS=$flags")
  if [ -d "$cuda" ]; then args+=(-DCUDAToolkit_ROOT="$cuda"); fi
  if [ ! -f "$dir/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then args+=(-G Ninja); fi
  cmake "${args[@]}" > "$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j "$jobs" --target "$@"
}

# A cubin cache of its own unless one is given (CI gives one), removed afterwards.
if [ -z "${KDTREE_CACHE_DIR:-}" ]; then
  KDTREE_CACHE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kdtree-san-cache.XXXXXX")
  trap 'rm -rf "$KDTREE_CACHE_DIR"' EXIT
fi
export KDTREE_CACHE_DIR
status=0
started=$(date +%s)

if [ "$what" = all ] || [ "$what" = asan ]; then
  t0=$(date +%s)
  echo "== sanitizers: ASan + UBSan build"
  # -Wno-maybe-uninitialized: GCC 12 warns falsely inside <regex> under the sanitizers.
  build "$base/asan" "-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -Wno-maybe-uninitialized" \
    kdtree_tests kdtree-gen kdtree
  echo "== sanitizers: ASan + UBSan build took $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  # Leaks are checked too; print_stacktrace shows where UBSan fired.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "$base/asan/kdtree_tests" -tce='default grid compiles*' --no-intro=true || status=1
  bash "$root/tests/install/check_no_driver_link.sh" "$base/asan/libkdtree.so" "$base/asan/kdtree-gen" || status=1
  echo "== sanitizers: ASan + UBSan tests took $(( $(date +%s) - t0 )) s"
fi

if [ "$what" = all ] || [ "$what" = tsan ]; then
  t0=$(date +%s)
  echo "== sanitizers: TSan build"
  build "$base/tsan" "-fsanitize=thread -fno-sanitize-recover=all -Wno-maybe-uninitialized" kdtree_thread_tests
  echo "== sanitizers: TSan build took $(( $(date +%s) - t0 )) s"
  t0=$(date +%s)
  # kdtree_thread_tests: the cache tests (threads and processes racing on one key,
  # held locks, throwing builds), the runtime's compile-once under threads and the
  # thread-local error.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 "$base/tsan/kdtree_thread_tests" --no-intro=true || status=1
  echo "== sanitizers: TSan tests took $(( $(date +%s) - t0 )) s"
fi

echo "== sanitizers: $( ((status)) && echo FAILED || echo passed ) in $(( $(date +%s) - started )) s"
exit $status
