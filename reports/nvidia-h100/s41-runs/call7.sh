#!/usr/bin/env bash
# Session 41 call 7: dslab-late2 / dslab-late4: warpgroup 0's first thread prefetches the next segment's first blocks
# (their nine boxes each, by the tensor map) into L2 two / four pairs before the segment's end, so that the switch
# finds them there instead of asking memory for them with every other CTA (session 39's placements of such a late
# prefetch spilled; an opaque shared load of the slots builds clean). Interleaved against 9c79292 (dslab), 128 heads
# batch 128, verified.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
BINS="dslab dslab-late2 dslab-late4" AB_LIMIT=60 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128" \
  scripts/device_run.sh ab:c7:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
