#!/usr/bin/env bash
# The Python package's tests: a virtual environment in $KDTREE_BUILD_DIR/python-venv (default
# build/python-venv; it sees the system's site-packages, so an installed torch is reused), torch (from PyPI
# when missing: its Linux wheel is the CUDA build, which runs on the CPU too), pytest, numpy and transformers 5.x, then
# `pip install .` from this checkout and `pytest tests/python`. Without a GPU the GPU tests are
# reported as skipped. Extra arguments go to pytest.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}
venv=${KDTREE_VENV:-$build/python-venv}

if [ ! -x "$venv/bin/python" ] && ! python3 -m venv --system-site-packages "$venv" >/dev/null 2>&1; then
  # Debian's python3 makes virtual environments only with python3-venv installed.
  rm -rf "$venv"
  echo "test_python: installing python3-venv"
  sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  "${sudo[@]}" apt-get update
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv python3-pip
  python3 -m venv --system-site-packages "$venv"
fi
py=$venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "test_python: installing torch from PyPI"
  "$py" -m pip install -q torch
fi
"$py" -c 'import pytest, numpy' >/dev/null 2>&1 || "$py" -m pip install -q pytest numpy
# The transformers integration's CPU tests (tests/python/test_transformers_cpu.py); the supported range.
"$py" -c 'import transformers, sys; sys.exit(transformers.__version__.split(".")[0] != "5")' >/dev/null 2>&1 ||
  "$py" -m pip install -q 'transformers>=5.17,<6'
# The package exactly as a user installs it (README): builds libkdtree with CMake via scikit-build-core.
if [ -n "${KDTREE_JOBS:-}" ]; then export CMAKE_BUILD_PARALLEL_LEVEL=$KDTREE_JOBS; fi
"$py" -m pip install -q "$root"
# From outside the checkout, so `import kdtree` is the installed package.
mkdir -p "$build"
cd "$build"
"$py" -m pytest "$root/tests/python" -q -rs -p no:cacheprovider "$@"
