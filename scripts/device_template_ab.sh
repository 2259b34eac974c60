#!/usr/bin/env bash
# A/B of a kernel template change on the GPU machine, over binaries carried in .carry/ (built with the new
# templates embedded) and the old templates in an untracked directory of the checkout (copied there with
# `scripts/device_template_ab.sh --stage OLD_REV DIR`, here, before the run; KDTREE_TEMPLATE_DIR's layout).
# Runs bench_verify with the old templates and with the new ones in alternation, REPS times (default 2), and
# prints each run's graph µs per shape side by side. Output in $OUT (default /tmp/kdtree-ab-out):
# bench_<old|new>_<rep>.txt.
#   usage (GPU machine): bash scripts/device_template_ab.sh DIR [REPS] -- BENCH_VERIFY_ARGS...
#   usage (here):        bash scripts/device_template_ab.sh --stage OLD_REV DIR
set -uo pipefail
if [ "${1:-}" = --stage ]; then
  rev=$2 dir=$3
  rm -rf "$dir" && mkdir -p "$dir"
  git archive "$rev" templates include/kdtree/kdtree_device_errors.h | tar -x -C "$dir"
  mv "$dir"/templates/* "$dir"/ && mv "$dir"/include/kdtree/kdtree_device_errors.h "$dir"/ && rm -rf "$dir"/templates "$dir"/include
  echo "old templates of $rev in $dir ($(ls "$dir" | wc -l) files)"
  exit 0
fi
device_out=/tmp/kdtree-ab-out
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh"
old_dir=$(cd "${1:?usage: device_template_ab.sh DIR [REPS] -- BENCH_VERIFY_ARGS...}" && pwd) || exit 2
shift
reps=2
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  reps=$1
  shift
fi
[ "${1:-}" = -- ] && shift
status=0
for rep in $(seq 1 "$reps"); do
  for which in old new; do
    templates=()  # new: the carried binaries' embedded templates
    [ $which = old ] && templates=("KDTREE_TEMPLATE_DIR=$old_dir")
    env "${templates[@]}" timeout 200 "$carry/bin/bench_verify" "$@" >"$out/bench_${which}_${rep}.txt" 2>&1 || status=1
  done
done
# shape and graph column of each run, side by side
python3 - "$out" "$reps" <<'PY'
import os, sys
out, reps = sys.argv[1], int(sys.argv[2])
def rows(path):  # bench_verify's table: a 29-character shape, then us, b2b_us, graph_us, ...
    got = {}
    for line in open(path) if os.path.exists(path) else []:
        if line.startswith(("mla", "gqa")) and len(line.split()) > 4:
            got[line[:29].strip()] = line[29:].split()[2]
    return got
runs = [(f"{w}{r}", rows(os.path.join(out, f"bench_{w}_{r}.txt"))) for r in range(1, reps + 1) for w in ("old", "new")]
print("graph us".ljust(30) + "".join(n.rjust(9) for n, _ in runs))
for shape in runs[0][1]:
    print(shape.ljust(30) + "".join(r.get(shape, "-").rjust(9) for _, r in runs))
PY
exit $status
