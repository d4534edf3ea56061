#!/usr/bin/env bash
# The planner at every whole-model point an offload run measured: one `dslab plan` per (model, batch, q_len, kv_len,
# GPU budget), on the machine file of the run's machine, with the run's placements as measured_s and, when the run
# has them, the CPU engine's and the GPU grouped GEMMs' curves; plus DeepSeek-V3 decode on a 24 GB budget. Then one
# line per runnable placement (plan, placement, predicted ms, measured ms, predicted/measured, chosen, fastest
# measured; `noisy` where the run's p10-p90 spans more than 25% of its median: a disturbed host, re-run it). Re-plans the offload topic's committed results (reports/<device>/offload/) with today's planner.
# Usage: scripts/plan_offload.sh RESULTS_JSON MACHINE_JSON PLANS_DIR   (dslab on PATH)
set -euo pipefail
results=${1:?usage: scripts/plan_offload.sh RESULTS_JSON MACHINE_JSON PLANS_DIR}
machine=${2:?machine file}
plans=${3:?plans folder}
mkdir -p "$plans"
# each whole-model point run: model batch q_len kv_len budget, and whether the CPU engine and the GPU MoE ran alone at that model
python3 - "$results" <<'PY' | while read -r model batch q kv budget engine grouped; do
import json, lzma, sys
benchmarks = json.load((lzma.open if sys.argv[1].endswith(".xz") else open)(sys.argv[1], "rt"))["benchmarks"]
engine = {b["model"] for b in benchmarks if b.get("variant") == "moe/auto/cpu"}
grouped = {b["model"] for b in benchmarks if b.get("variant") == "moe/grouped/cuda"}
seen = set()
for b in benchmarks:
    if b.get("variant") not in ("layer/deepseek/cuda", "layer/deepseek/hybrid") or b.get("run_type") == "aggregate":
        continue
    a = b["axes"]
    budget = a.get("gpu_budget", "all")
    key = (b["model"], a["batch"], a["q_len"], a["kv_len"], budget[:-2] if budget.endswith("GB") else 0)
    if key not in seen:
        seen.add(key)
        print(*key, int(b["model"] in engine), int(b["model"] in grouped))
PY
  phase=$([ "$q" -gt 1 ] && echo prefill || echo decode)
  engine_runs=(); [ "$engine" = 1 ] && engine_runs=(--cpu-experts "$results")
  [ "$grouped" = 1 ] && engine_runs+=(--gpu-experts "$results")
  budget_args=(); suffix=""; [ "$budget" != 0 ] && budget_args=(--gpu-budget "$budget") && suffix="-${budget}gb"
  dslab plan --model "$model" --phase $phase --batch "$batch" --q-len "$q" --kv-len "$kv" --machine "$machine" --measured "$results" \
    "${engine_runs[@]}" "${budget_args[@]}" --out "$plans/$model-$phase-b$batch-q$q-kv$kv$suffix" >/dev/null
done
v3_engine=()
python3 -c 'import json, lzma, sys; sys.exit(not any(b.get("variant") == "moe/auto/cpu" and b["model"] == "deepseek-v3"
            for b in json.load((lzma.open if sys.argv[1].endswith(".xz") else open)(sys.argv[1], "rt"))["benchmarks"]))' "$results" 2>/dev/null && v3_engine=(--cpu-experts "$results")
dslab plan --model deepseek-v3 --batch 1 --gpu-budget 24 --machine "$machine" "${v3_engine[@]}" --out "$plans/deepseek-v3-decode-b1-24gb" >/dev/null
python3 - "$plans" <<'PY'
import json, pathlib, sys
for plan_file in sorted(pathlib.Path(sys.argv[1]).glob("*/plan.json")):
    plan = json.loads(plan_file.read_text())
    runs = [p for p in plan["placements"] if p.get("measured_s") is not None]
    fastest = min((p["measured_s"] for p in runs), default=None)
    for p in runs:
        print(f'{plan_file.parent.name:45s} {p["placement"]:17s} predicted {p["predicted_s"] * 1e3:9.2f} ms  measured {p["measured_s"] * 1e3:9.2f} ms'
              f'  {p["predicted_s"] / p["measured_s"]:5.2f}  {"chosen" if p.get("chosen") else "      "}  {"fastest" if p["measured_s"] == fastest else "       "}'
              f'  {"noisy" if (p.get("measured_spread") or 0) > 0.25 else ""}')
PY
