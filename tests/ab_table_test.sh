#!/usr/bin/env bash
# scripts/ab_table.py: each binary's rounds in order, medians, the base's median over each other's; bad input exit 2.
set -uo pipefail
python=$1 script=$2 dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() {  # FOLDER KERNEL_US... : one results.json, a point at kv_len 4096 with that kernel time (and one at 8192, 2x)
  mkdir -p "$dir/ab/$1"
  printf '{"benchmarks": [{"name": "mla/fused/cuda/deepseek-v3/kv_len:4096", "model": "deepseek-v3", "axes": {"kv_len": 4096}, "counters": {"kernel_s": %s, "decode_phase_us.last_done": 7}},
    {"name": "mla/fused/cuda/deepseek-v3/kv_len:8192", "model": "deepseek-v3", "axes": {"kv_len": 8192}, "counters": {"kernel_s": %s}},
    {"name": "mla/fused/cuda/deepseek-v3/kv_len:8192_median", "aggregate_name": "median", "counters": {}}]}\n' \
    "$2e-6" "$(( $2 * 2 ))e-6" >"$dir/ab/$1/results.json"
}
expect() {  # EXIT DESCRIPTION PATTERN ARGS... (PATTERN: an extended regex the output must match, or -)
  local want=$1 what=$2 pattern=$3; shift 3
  "$python" "$script" "$@" >"$dir/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; cat "$dir/out"; exit 1; fi
  if [ "$pattern" != - ] && ! grep -qE -e "$pattern" "$dir/out"; then echo "FAIL: $what: no line matching '$pattern'"; cat "$dir/out"; exit 1; fi
  echo "ok: $what"
}
run x-dslab-base-1 200; run x-dslab-base-2 210; run x-dslab-base-3 190
run x-dslab-new-1 180;  run x-dslab-new-2 175;  run x-dslab-new-3 185
expect 0 "rounds in order and the median" "kernel_s +dslab-new +180.0 +175.0 +185.0 +median +180.0 +dslab-base / this 1.111" "$dir/ab"
expect 0 "a second point, the aggregate skipped" "kernel_s +dslab-base +400.0 +420.0 +380.0 +median +400.0$" "$dir/ab"
expect 0 "points named by variant, model and axes" "^mla/fused/cuda deepseek-v3 kv_len=4096$" "$dir/ab"
expect 0 "another base" "kernel_s +dslab-base .* dslab-new / this 0.900" "$dir/ab" --base dslab-new
expect 0 "a phase counter beside" "last_done +dslab-new +7.0 +7.0 +7.0 +median +7.0$" "$dir/ab" --phases last_done
expect 2 "a base not run" "--base dslab-old: not among" "$dir/ab" --base dslab-old
expect 2 "a counter no point has" "no counter step_s" "$dir/ab" --counter step_s
mkdir -p "$dir/empty"
expect 2 "no runs" "no TAG-BINARY-ROUND/results.json" "$dir/empty"
mkdir -p "$dir/bad/x-dslab-1" && echo '{' >"$dir/bad/x-dslab-1/results.json"
expect 2 "a broken results file" "not a dslab results file" "$dir/bad"
