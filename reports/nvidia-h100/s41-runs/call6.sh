#!/usr/bin/env bash
# Session 41 call 6: call 5's explicit evict_normal turned out far worse than no hint (batch 64, its one segment
# normal: 8-12% slower; no hint at all was 1.2% slower in call 3). dslab-lastu1: as call 5's lastn1 (the CTA's last
# segment, where it walks two or more, with another policy than evict_first) but evict_unchanged there. Interleaved
# against 9c79292 (dslab), 128 heads batch 128, verified (the policy is a hint only: call 5 GPU-tested the layout).
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
BINS="dslab dslab-lastu1" AB_LIMIT=60 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128" \
  scripts/device_run.sh ab:c6:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
