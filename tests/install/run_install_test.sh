#!/usr/bin/env bash
# Installs a built kdtree into a temporary prefix, then configures, builds and runs
# tests/install/consumer against it with find_package(kdtree), and runs the
# installed kdtree-gen.
# Usage: run_install_test.sh BUILD_DIR [CMAKE_COMMAND] [CMAKE_GENERATOR]
set -euo pipefail

build_dir=$(cd "${1:?usage: run_install_test.sh BUILD_DIR [CMAKE_COMMAND] [CMAKE_GENERATOR]}" && pwd)
cmake_bin=${2:-cmake}
generator=${3:-}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kdtree-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$cmake_bin" --install "$build_dir" --prefix "$work/prefix" >"$work/install.log" || {
  cat "$work/install.log"; exit 1; }
for f in include/kdtree/kdtree.h include/kdtree/kdtree.hpp bin/kdtree-gen; do
  [ -e "$work/prefix/$f" ] || { echo "install test: $f was not installed" >&2; exit 1; }
done

gen_args=()
if [ -n "$generator" ]; then gen_args=(-G "$generator"); fi
"$cmake_bin" -S "$here/consumer" -B "$work/build" "${gen_args[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix"
"$cmake_bin" --build "$work/build"

# The cache dir is private, so the consumer's warm really compiles.
"$work/build/consumer_c" "$work/cache"
"$work/build/consumer_cpp" "$work/cache"

"$work/prefix/bin/kdtree-gen" --version
"$work/prefix/bin/kdtree-gen" emit --op tree_accept --width 16 >"$work/tree_accept.cu"
grep -q 'extern "C"' "$work/tree_accept.cu"
echo "install test: OK"
