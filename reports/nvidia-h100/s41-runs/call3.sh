#!/usr/bin/env bash
# Session 41 call 3: dslab-tidy (session 40's leftover: pair_wg1's always-true guard and Segment::padding's past-the-end
# arm gone, fetch_ahead bounded by the walked blocks; 7760 instructions an instance against 7832) GPU-tested; then
# interleaved against this tree's dslab with two L2 experiments on top of tidy: dslab-nohint (the blocks' copies
# unhinted at every length: call 1's kv scan has our time growing 1.87 us a block at 2K-8K keys, where the evict_first
# hint is on, against 1.79 at 8K-16K, where it is off - FlashInfer 1.84-1.87 throughout) and dslab-qlast (unhinted,
# and the next segment's Q prefetched into L2 evict_last, so the switch still finds it there).
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 150 $(command -v dslab_tests-tidy) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-tidy.log 2>&1
echo "tidy GpuMla exit $?"; grep -E '^\[  (FAILED|PASSED)' $OUT/gpu-tests-tidy.log | tail -6
echo "t=$(( $(date +%s) - T0 ))"
BINS="dslab dslab-tidy dslab-nohint dslab-qlast" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192,16384 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c3:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
