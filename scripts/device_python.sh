#!/usr/bin/env bash
# On the GPU machine (no package registry): installs the carried wheel (.whl/kdtree-*.whl, built with
# `pip wheel . -w .whl --no-deps --no-build-isolation`) into /tmp/site, warms the kernels the tests use
# through `python -m kdtree warm`, runs the Python GPU test suite and the host-overhead benchmark.
# Uses .carry/cache (scripts/pack_device_carry.sh) as the starting cubin cache and
# .carry/bin/bench_host_overhead for the C++ side of the overhead comparison, when present.
# Logs go to $OUT (default /tmp/kdtree-out): python_info.txt, warm.log, pytest.log, pytest.xml,
# worst_errors.json, python_overhead.txt/.json. Exit status: pytest's, or 1 if a step failed.
# usage: bash scripts/device_python.sh [all|tests|bench] [pytest args...]   (default all)
set -uo pipefail
what=${1:-all}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=${OUT:-/tmp/kdtree-out}
mkdir -p "$out"
status=0

wheel=$(ls .whl/kdtree-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "device_python: no .whl/kdtree-*.whl; build it first: pip wheel . -w .whl --no-deps --no-build-isolation" >&2
  exit 1
fi
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$wheel" || exit 1
export PYTHONPATH=/tmp/site:$root/tests/python
cd /tmp  # import the installed package, never python/kdtree from the checkout
export KDTREE_CACHE_DIR=/tmp/kdtree-py-cache
mkdir -p "$KDTREE_CACHE_DIR"
[ -d "$root/.carry/cache" ] && cp -r "$root/.carry/cache/." "$KDTREE_CACHE_DIR/"

python3 -m kdtree info 2>&1 | tee "$out/python_info.txt"
# The default grid (reused from .carry/cache when it was carried), then the points the tests use beyond it.
warm=(python3 -m kdtree warm --arch native -j "$(nproc)")
{ "${warm[@]}" &&
  "${warm[@]}" --heads mla576/512 --widths 32 --pages 32 --dtypes f16 --no-tree-ops &&
  "${warm[@]}" --heads gqa128 --widths 128 --pages 128 --dtypes f16 --no-tree-ops &&
  "${warm[@]}" --no-attention --widths 64 --pages 128; } > "$out/warm.log" 2>&1 || status=1
grep "^warm:" "$out/warm.log"

if [ "$what" != bench ]; then
KDTREE_PY_REPORT="$out/worst_errors.json" python3 -m pytest "$root/tests/python" -v -rs -p no:cacheprovider \
  --junitxml="$out/pytest.xml" "$@" > "$out/pytest.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR)|passed|failed|skipped" "$out/pytest.log" | tail -25
sed -n '/worst error per operator/,/^=/p' "$out/pytest.log"
[ $rc -ne 0 ] && status=$rc
fi
[ "$what" = tests ] && exit $status

cpp=()
if [ -x "$root/.carry/bin/bench_host_overhead" ]; then
  cpp=(--cpp "$root/.carry/bin/bench_host_overhead")
  export LD_LIBRARY_PATH=$root/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
fi
python3 "$root/bench/python_overhead.py" "${cpp[@]}" --json "$out/python_overhead.json" 2>&1 | tee "$out/python_overhead.txt" || status=1
exit $status
