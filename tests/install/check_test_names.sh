#!/usr/bin/env bash
# Every doctest case must reach CTest whole: doctest_discover_tests makes a CMake list
# of the names, and CMake splits a list at a ';' outside square brackets, so such a case
# becomes two CTest tests whose filters match nothing and which pass without running.
# usage: check_test_names.sh TEST_BINARY...
set -euo pipefail
status=0
for binary in "$@"; do
  # --list-test-cases prints the names between its header and footer lines ("[doctest] ...").
  while IFS= read -r name; do
    outside=$(sed -E ':a; s/\[[^][]*\]//; ta' <<<"$name")  # drop the bracketed parts
    if [[ $outside == *";"* ]]; then
      echo "check_test_names: $(basename "$binary"): a ';' outside brackets splits this case in CTest: $name"
      status=1
    fi
  done < <("$binary" --list-test-cases --no-version 2>/dev/null | grep -v '^\[doctest\]' | grep -v '^=*$')
done
[ $status -eq 0 ] && echo "check_test_names: every case name reaches CTest whole"
exit $status
