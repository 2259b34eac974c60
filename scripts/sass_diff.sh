#!/usr/bin/env bash
# Proves a refactor leaves the generated kernels unchanged: compiles the default
# warm grid into a fresh cache for each arch and disassembles every cubin by
# grid point (tools/sass_snapshot.py), then compares two such snapshots.
#
#   scripts/sass_diff.sh snapshot OUT [sm_120 sm_90 ...]   # OUT/<arch>/<grid point>.sass|.res
#   scripts/sass_diff.sh compare BASE NEW                  # exit 1 and list the differences
#
# Needs a built kdtree-gen ($KDTREE_BUILD_DIR, default build/) and nvdisasm (see
# tools/sass_snapshot.py). No GPU: NVRTC compiles offline. KDTREE_WARM_JOBS sets -j.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${KDTREE_BUILD_DIR:-$root/build}

case "${1:-}" in
  snapshot)
    out=${2:?usage: sass_diff.sh snapshot OUT [ARCH...]}
    shift 2
    archs=("$@")
    [ ${#archs[@]} -gt 0 ] || archs=(sm_120 sm_90)
    for arch in "${archs[@]}"; do
      cache=$(mktemp -d "${TMPDIR:-/tmp}/kdtree-sass-$arch-XXXXXX")
      # The tiles override would change what is compiled: snapshot the normal path.
      env -u KDTREE_VERIFY_TILES -u KDTREE_TEMPLATE_DIR \
        "$build/kdtree-gen" warm --arch "$arch" --cache-dir "$cache" -j "${KDTREE_WARM_JOBS:-2}" | tail -n 1
      rm -rf "${out:?}/$arch"
      python3 "$root/tools/sass_snapshot.py" "$cache" "$out/$arch"
      rm -rf "$cache"
    done
    ;;
  compare)
    base=${2:?usage: sass_diff.sh compare BASE NEW}
    new=${3:?usage: sass_diff.sh compare BASE NEW}
    if diff -r -q "$base" "$new"; then
      echo "sass_diff: identical ($(find "$base" -name '*.sass' | wc -l) kernels' SASS and resources)"
    else
      echo "sass_diff: differences above (diff -r $base $new for details)"
      exit 1
    fi
    ;;
  *)
    sed -n '2,10p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
