#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck) over small points of the GPU ops a layer composes: the layer on the
# tiny model (every kernel of the unfused path, the MoE router, permutation, grouped GEMMs, combine) and on one
# V2-Lite layer (the fused decode kernel), each MoE op alone. A point runs once or twice (sampling under the
# sanitizer is slow); the sanitizer's summary line decides. Usage: scripts/sanitize.sh OUT_DIR (dslab on PATH)
set -uo pipefail
out=${1:?usage: scripts/sanitize.sh OUT_DIR}
mkdir -p "$out"
quick=(--min-samples 1 --min-time 0 --timeout 0.01)
status=0
run() {
  local tool=$1 name=$2; shift 2
  if compute-sanitizer --tool "$tool" --error-exitcode 3 dslab run "$@" "${quick[@]}" --out "$out/tmp-$name" >"$out/$tool-$name.log" 2>&1; then
    echo "$tool $name: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool-$name.log" | tail -1)"
  else
    echo "$tool $name: FAILED (exit $?), see $tool-$name.log"; status=1
  fi
  rm -rf "$out/tmp-$name"
}
for tool in memcheck racecheck; do
  run "$tool" layer-tiny --model tiny --variant layer/deepseek/cuda --axis layers=all --axis attn=mla/a_cc_me/cuda --axis batch=3 --axis kv_len=40 --axis page_size=16 --axis executor=eager
  run "$tool" layer-v2-lite-fused --model deepseek-v2-lite --variant layer/deepseek/cuda --axis layers=1 --axis batch=2 --axis kv_len=150 --axis executor=eager
  run "$tool" moe-grouped --model deepseek-v2-lite --variant moe/grouped/cuda --axis tokens=1,300
  run "$tool" moe-loop --model deepseek-v2-lite --variant moe/loop/cuda --axis tokens=37
done
exit $status
