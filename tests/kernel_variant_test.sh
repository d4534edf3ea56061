#!/usr/bin/env bash
# scripts/kernel_variant.sh's bad input: one line and exit 2 before anything is compiled (building a variant needs
# nvcc and a CUDA build tree: done by hand, its machine code compared with the build's own).
set -uo pipefail
script=$1 dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
expect() {  # EXIT DESCRIPTION PATTERN ARGS...
  local want=$1 what=$2 pattern=$3; shift 3
  "$script" "$@" >"$dir/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; cat "$dir/out"; exit 1; fi
  if ! grep -qE -e "$pattern" "$dir/out" || [ "$(wc -l <"$dir/out")" != 1 ]; then echo "FAIL: $what: not one line matching '$pattern'"; cat "$dir/out"; exit 1; fi
  echo "ok: $what"
}
expect 2 "no name" "^usage: scripts/kernel_variant.sh NAME"
expect 2 "a name that is no file name part" "NAME 'a/b': expected letters, digits or _" a/b
SRC=variants/none.cu expect 2 "a source not in the tree" "SRC 'variants/none.cu': no such file" x
BUILD="$dir/nobuild" expect 2 "no build tree" "compile_commands.json missing: configure and build" x
