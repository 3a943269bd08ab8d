#!/usr/bin/env bash
# Fails if any tracked C++ file differs from what clang-format (.clang-format) would write.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc')
[ ${#files[@]} -gt 0 ] || { echo "check-format: no sources found" >&2; exit 1; }
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/spindle-format.$$; then
  grep -E '^[^ ].*: (error|warning):' /tmp/spindle-format.$$ | cut -d: -f1 | sort -u | sed 's/^/  needs formatting: /'
  rm -f /tmp/spindle-format.$$
  echo "check-format: run 'make format'" >&2
  exit 1
fi
rm -f /tmp/spindle-format.$$
echo "check-format: ${#files[@]} files formatted"
