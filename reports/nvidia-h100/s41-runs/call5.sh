#!/usr/bin/env bash
# Session 41 call 5: call 1's kv scan has our kernel growing 1.87 us a block at batch 128 (two segments a CTA) where the
# evict_first hint is on (2K-8K keys), against 1.78 at batch 64 (one segment) - so is it the CTA's second segment, after
# the switch, that the hint slows? dslab-lastn1: the block copies' L2 policy chosen per segment (read from shared
# memory at each copy), evict_first except in the CTA's last segment where the CTA walks more than one (normal there);
# dslab-lastn2: normal in every CTA's last segment (batch 64's only one too). GPU-tested, then interleaved against
# 9c79292 (dslab).
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 120 $(command -v dslab_tests-lastn1) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-lastn1.log 2>&1
echo "lastn1 GpuMla exit $?"; grep -E '^\[  (FAILED|PASSED)' $OUT/gpu-tests-lastn1.log | tail -6
echo "t=$(( $(date +%s) - T0 ))"
BINS="dslab dslab-lastn1 dslab-lastn2" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c5:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
