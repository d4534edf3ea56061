#!/usr/bin/env bash
# How the CI gate's threshold was chosen (.ci/run): RUNS unchanged runs of the smoke sweep, PASSES whole-run passes
# each, every pair compared as the gate compares (normalized by mla/a_cc_me/cpu) at several thresholds: how many
# false SLOWER verdicts, and whether a 1.5x slowdown of one variant (mla/cd/cpu at 1K; its times scaled in the newer
# file of the pair) is still caught. Also the same pairs with one pass each (the per-sample test).
# Usage: scripts/gate_study.sh OUT_DIR [RUNS (6)] [PASSES (5)]   (after scripts/test.sh has built build/dslab)
set -euo pipefail
out=${1:?usage: scripts/gate_study.sh OUT_DIR [RUNS] [PASSES]}
runs=${2:-6}
passes=${3:-5}
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
  echo "run $i of $runs ..." >&2
  build/dslab run workloads/sweeps/ci-smoke.json --repetitions "$passes" --min-samples 10 --timeout 3 --out "$out/run$i" >"$out/run$i.log" 2>&1
done
python3 - "$out" "$runs" <<'PY'
import json, sys
out, runs = sys.argv[1], int(sys.argv[2])
def scaled(b):
    return b.get("variant") == "mla/cd/cpu" and b.get("run_type") == "iteration" and b["axes"]["kv_len"] == 1024
for i in range(1, runs + 1):
    d = json.load(open(f"{out}/run{i}/results.json"))
    one = dict(d, benchmarks=[dict(b, repetitions=1) for b in d["benchmarks"]
                              if b.get("run_type") == "iteration" and b["repetition_index"] == 0])
    for name, data in (("passes", d), ("single", one)):
        json.dump(data, open(f"{out}/{name}{i}.json", "w"))
        slow = json.loads(json.dumps(data))
        for b in slow["benchmarks"]:
            if scaled(b):
                b["real_time"] *= 1.5
                b["sample_times"] = [t * 1.5 for t in b["sample_times"]]
        json.dump(slow, open(f"{out}/{name}-slow{i}.json", "w"))
PY
for t in 0.05 0.10 0.20 0.30; do
  for mode in passes single; do
    false_slower=0; caught=0; pairs=0
    for i in $(seq 1 "$runs"); do
      for j in $(seq $((i + 1)) "$runs"); do
        a="$out/$mode$i.json"
        false_slower=$((false_slower + $(build/dslab compare "$a" "$out/$mode$j.json" --normalize mla/a_cc_me/cpu --threshold $t | grep -c ' SLOWER$' || true)))
        caught=$((caught + $(build/dslab compare "$a" "$out/$mode-slow$j.json" --normalize mla/a_cc_me/cpu --threshold $t |
                              grep 'mla/cd/cpu.*kv_len:1024' | grep -c ' SLOWER$' || true)))
        pairs=$((pairs + 1))
      done
    done
    echo "threshold $t, $mode: $false_slower false SLOWER over $pairs unchanged pairs; 1.5x slowdown caught in $caught of $pairs"
  done
done
