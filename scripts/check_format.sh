#!/usr/bin/env bash
# Formatting check (CI): clang-format --dry-run over the C and C++ sources the
# repository's .clang-format is meant for: every *.c, *.h, *.cpp and *.hpp outside
# templates/ (the kernel sources and their headers keep their hand layout, as
# .clang-format says: the generator also reads the config headers' exact lines).
# `--fix` rewrites them instead.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' | grep -v -e '^tests/install/consumer/' -e '^templates/')
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! command -v clang-format >/dev/null 2>&1; then
  echo "check_format: clang-format is not installed (apt-get install clang-format)" >&2
  exit 1
fi
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'check_format: not formatted (scripts/check_format.sh --fix):\n' >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
