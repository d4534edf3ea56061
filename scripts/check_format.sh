#!/usr/bin/env bash
# Every C++/CUDA source against .clang-format (120 columns): the files clang-format would change, and exit 1 if any.
# Skipped (77) without clang-format.
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "clang-format not found: skipped"; exit 77; }
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
bad=()
for f in "${files[@]}"; do clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f"); done
if [ ${#bad[@]} -gt 0 ]; then
  printf 'not formatted (clang-format -i FILE): %s\n' "${bad[@]}"
  exit 1
fi
echo "${#files[@]} sources formatted"
