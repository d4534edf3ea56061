#!/usr/bin/env bash
# The kernel A/B tools. scripts/ab_table.py: each binary's rounds in order, medians, the base's median over each
# other's. scripts/kernel_variant.sh: bad input (building a variant needs nvcc and a CUDA build tree: done by hand,
# its machine code compared with the build's own). Bad input: exit 2 (kernel_variant.sh's in one line).
set -uo pipefail
python=$1 root=$2 dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
table=$root/scripts/ab_table.py variant=$root/scripts/kernel_variant.sh
expect() {  # EXIT DESCRIPTION PATTERN COMMAND... (PATTERN: an extended regex the output must match; ONE_LINE=1: and
            # the output is that one line)
  local want=$1 what=$2 pattern=$3; shift 3
  "$@" >"$dir/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; cat "$dir/out"; exit 1; fi
  if ! grep -qE -e "$pattern" "$dir/out"; then echo "FAIL: $what: no line matching '$pattern'"; cat "$dir/out"; exit 1; fi
  if [ -n "${ONE_LINE:-}" ] && [ "$(wc -l <"$dir/out")" != 1 ]; then echo "FAIL: $what: not one line"; cat "$dir/out"; exit 1; fi
  echo "ok: $what"
}
run() {  # FOLDER KERNEL_US: one results.json, a point at kv_len 4096 with that kernel time (and one at 8192, 2x)
  mkdir -p "$dir/ab/$1"
  printf '{"benchmarks": [{"name": "mla/fused/cuda/deepseek-v3/kv_len:4096", "model": "deepseek-v3", "axes": {"kv_len": 4096}, "counters": {"kernel_s": %s, "decode_phase_us.last_done": 7}},
    {"name": "mla/fused/cuda/deepseek-v3/kv_len:8192", "model": "deepseek-v3", "axes": {"kv_len": 8192}, "counters": {"kernel_s": %s}},
    {"name": "mla/fused/cuda/deepseek-v3/kv_len:8192_median", "aggregate_name": "median", "counters": {}}]}\n' \
    "$2e-6" "$(( $2 * 2 ))e-6" >"$dir/ab/$1/results.json"
}
run x-dslab-base-1 200; run x-dslab-base-2 210; run x-dslab-base-3 190
run x-dslab-new-1 180;  run x-dslab-new-2 175;  run x-dslab-new-3 185
expect 0 "rounds in order and the median" "kernel_s +dslab-new +180.0 +175.0 +185.0 +median +180.0 +dslab-base / this 1.111" "$python" "$table" "$dir/ab"
expect 0 "a second point, the aggregate skipped" "kernel_s +dslab-base +400.0 +420.0 +380.0 +median +400.0$" "$python" "$table" "$dir/ab"
expect 0 "points named by variant, model and axes" "^mla/fused/cuda deepseek-v3 kv_len=4096$" "$python" "$table" "$dir/ab"
expect 0 "another base" "kernel_s +dslab-base .* dslab-new / this 0.900" "$python" "$table" "$dir/ab" --base dslab-new
expect 0 "a phase counter beside" "last_done +dslab-new +7.0 +7.0 +7.0 +median +7.0$" "$python" "$table" "$dir/ab" --phases last_done
expect 2 "a base not run" "--base dslab-old: not among" "$python" "$table" "$dir/ab" --base dslab-old
expect 2 "a counter no point has" "no counter step_s" "$python" "$table" "$dir/ab" --counter step_s
mkdir -p "$dir/empty"
expect 2 "no runs" "no TAG-BINARY-ROUND/results.json" "$python" "$table" "$dir/empty"
mkdir -p "$dir/bad/x-dslab-1" && echo '{' >"$dir/bad/x-dslab-1/results.json"
expect 2 "a broken results file" "not a dslab results file" "$python" "$table" "$dir/bad"
ONE_LINE=1 expect 2 "kernel_variant.sh: no name" "^usage: scripts/kernel_variant.sh NAME" "$variant"
ONE_LINE=1 expect 2 "kernel_variant.sh: a name that is no file name part" "NAME 'a/b': expected letters, digits or _" "$variant" a/b
ONE_LINE=1 expect 2 "kernel_variant.sh: a source not in the tree" "SRC 'variants/none.cu': no such file" env SRC=variants/none.cu "$variant" x
ONE_LINE=1 expect 2 "kernel_variant.sh: one of several sources not in the tree" "SRC 'variants/none.cu': no such file" \
  env SRC="variants/mla/cuda/fused/host.cu variants/none.cu" "$variant" x
ONE_LINE=1 expect 2 "kernel_variant.sh: an empty source list" "SRC '': expected one or more sources" env SRC=" " "$variant" x
ONE_LINE=1 expect 2 "kernel_variant.sh: no build tree" "compile_commands.json missing: configure and build" env BUILD="$dir/nobuild" "$variant" x
