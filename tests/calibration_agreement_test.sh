#!/usr/bin/env bash
# scripts/calibration_agreement.py: ceilings (rates) checked at 5%, latency costs only on request, bad input exit 2.
set -uo pipefail
python=$1 script=$2 dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
machine() {  # FILE HBM GEMM LAUNCH_S
  printf '{"cpu_model": "X", "cpu": {"threads": 2, "dram_read_bytes_per_s": 1e11}, "gpu": {"hbm_bytes_per_s": %s, "tensor_bf16_flops": %s, "launch_overhead_s": %s, "memory_bytes": 8e10}}\n' \
    "$2" "$3" "$4" >"$1"
}
expect() {  # EXIT DESCRIPTION ARGS...
  local want=$1 what=$2; shift 2
  "$python" "$script" "$@" >"$dir/out" 2>&1
  local got=$?
  if [ "$got" != "$want" ]; then echo "FAIL: $what: exit $got, expected $want"; cat "$dir/out"; exit 1; fi
  echo "ok: $what"
}
machine "$dir/a.json" 3.0e12 8.0e14 4.0e-6
machine "$dir/b.json" 2.95e12 8.2e14 5.2e-6    # ceilings within 5%, the launch cost 30% apart
machine "$dir/c.json" 2.7e12 8.0e14 4.0e-6     # HBM 10% lower
expect 0 "ceilings agree, a cost differs (not checked)" "$dir/a.json" "$dir/b.json"
expect 1 "the cost checked when asked" "$dir/a.json" "$dir/b.json" --cost-tolerance 0.1
expect 1 "a ceiling 10% apart" "$dir/a.json" "$dir/c.json"
echo '{"cpu": 1}' >"$dir/bad.json"
expect 2 "not a machine file" "$dir/a.json" "$dir/bad.json"
grep -q "hbm_bytes_per_s" "$dir/out" && { echo "FAIL: bad input printed a table"; exit 1; }
exit 0
