#!/usr/bin/env bash
# Session 40 call 9: call 8's evict_first finding again - dslab-ef160 (segments of up to 160 blocks hinted: 8K keys'
# 129) against the build (dslab, 96), interleaved, 4 rounds at 128 heads 8K, batch 64 and 128; the long-split GPU
# tests with ef160 (the unhinted instance's case now at ~190-block segments).
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 150 $(command -v dslab_tests-ef160) --gtest_filter='*GpuMla*LongSplit*:*GpuMla*Fused*' > $OUT/gpu-tests-ef160.log 2>&1
echo "gpu tests (ef160) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-ef160.log | head
BINS="dslab dslab-ef160" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=8192 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c9:4 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
