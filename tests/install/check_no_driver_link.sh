#!/usr/bin/env bash
# Fails when any given ELF file has a NEEDED entry for the CUDA driver (libcuda):
# kdtree loads the driver with dlopen at first device use, so that the library and
# kdtree-gen work on machines without one. Usage: check_no_driver_link.sh FILE...
set -euo pipefail
(($#)) || { echo "usage: $0 FILE..." >&2; exit 2; }
status=0
for f in "$@"; do
  needed=$(readelf -d "$f" | awk '/\(NEEDED\)/ {print $NF}' | tr -d '[]')
  [ -n "$needed" ] || { echo "FAIL: $f: readelf found no NEEDED entries (not a dynamic ELF file?)" >&2; exit 2; }
  if grep -q '^libcuda\.so' <<<"$needed"; then
    echo "FAIL: $f links the CUDA driver: $(grep '^libcuda' <<<"$needed" | tr '\n' ' ')" >&2
    status=1
  else
    echo "ok: $f: NEEDED $(tr '\n' ' ' <<<"$needed")"
  fi
done
exit $status
