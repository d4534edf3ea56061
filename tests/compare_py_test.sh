#!/usr/bin/env bash
# Google Benchmark's tools/compare.py (Debian: libbenchmark-tools) must read two dslab results files.
# Exit 77 (skipped) where the tool or a Python with scipy is absent.
set -euo pipefail
dslab=$1 python=$2 out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
compare=/usr/share/benchmark/compare.py
[ -f "$compare" ] && "$python" -c 'import scipy' 2>/dev/null || { echo "compare.py or scipy missing: skipped"; exit 77; }
for run in a b; do
  "$dslab" run --model tiny --variant mla/cd/cpu --variant mla/a_cc_me/cpu --axis kv_len=64 \
    --min-samples 3 --min-time 0 --timeout 1 --out "$out/$run" >/dev/null 2>&1
done
report=$("$python" "$compare" benchmarks "$out/a/results.json" "$out/b/results.json")
echo "$report"
grep -q 'mla/cd/cpu/tiny/batch:1/q_len:1/kv_len:64' <<<"$report"
grep -q 'mla/a_cc_me/cpu/tiny/batch:1/q_len:1/kv_len:64' <<<"$report"
grep -q OVERALL_GEOMEAN <<<"$report"
