#!/usr/bin/env bash
# Installs missing build packages, builds, and runs the whole test suite: the C++ suite (ctest)
# and the Python package's (scripts/test_python.sh: pip install . and pytest tests/python).
# Without a GPU the GPU tests (kdtree_gpu_tests) are reported as skipped.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}

"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure -j"${KDTREE_TEST_JOBS:-2}"
"$root/scripts/test_python.sh"
