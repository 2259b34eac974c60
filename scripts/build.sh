#!/usr/bin/env bash
# Configures and builds kdtree in build/ (or $KDTREE_BUILD_DIR), with Ninja when
# it is installed. KDTREE_JOBS sets the parallel jobs (default: 2 under CI,
# otherwise the number of cores); CMAKE_BUILD_TYPE defaults to RelWithDebInfo.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}
if [ -n "${KDTREE_JOBS:-}" ]; then
  jobs=$KDTREE_JOBS
elif [ "${CI:-}" = true ]; then
  jobs=2
else
  jobs=$(nproc 2>/dev/null || echo 2)
fi
cuda=${CUDA_HOME:-/usr/local/cuda}

args=(-S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-RelWithDebInfo}")
if [ -d "$cuda" ]; then args+=(-DCUDAToolkit_ROOT="$cuda"); fi
# The generator can only be chosen when the build directory is first configured.
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then args+=(-G Ninja); fi

cmake "${args[@]}"
cmake --build "$build" -j "$jobs"
