#!/usr/bin/env bash
# Sets kdtree up on this machine: installs missing build packages, builds,
# compiles the default kernel grid into the cubin cache (kdtree-gen warm: for the
# GPU present, else sm_120), and on a GPU machine runs the MLA example.
# Extra arguments go to `kdtree-gen warm`, e.g. --arch sm_90 or --heads mla576/512.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}

"$root/scripts/install_deps.sh"
"$root/scripts/build.sh"

"$build/kdtree-gen" warm "$@"
"$build/kdtree-gen" info

if "$build/kdtree-gen" info | grep -q '^device 0:'; then
  example=""
  for candidate in "$build/examples/verify_mla" "$build/verify_mla"; do
    if [ -x "$candidate" ]; then example=$candidate; break; fi
  done
  if [ -n "$example" ]; then
    echo "setup_and_warm: running $example"
    "$example"
  else
    echo "setup_and_warm: the verify_mla example was not built; skipping it" >&2
  fi
else
  echo "setup_and_warm: no GPU here, so the example was not run (the cache is warm for the arch above)"
fi
