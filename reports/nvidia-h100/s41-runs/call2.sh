#!/usr/bin/env bash
# Session 41 call 2: call 1's phase clocks showed, at 128 heads batch 128 with the evict_first hint (4K-8K keys), a
# CTA's second segment walking its pairs 2-5% slower than its first (and than batch 64's one segment), and not at
# 12K-16K (no hint). Guess: after the switch the two row tiles of a request no longer read each block at nearly the
# same time, and a hinted line leaves L2 before the later reader comes. dslab-clus: the two row tiles of a part
# launched as one two-CTA cluster (same kernel code; co-scheduled in one GPC); dslab-clusbar: and a cluster barrier at
# each segment's top, so both start each segment together. GPU-tested first, then interleaved against this tree's dslab.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
for v in clusbar; do  # (dslab-clus: the same launch, the kernel code md5-identical to dslab's)
  timeout 150 $(command -v dslab_tests-$v) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-$v.log 2>&1
  echo "$v GpuMla exit $?"; grep -E '^\[  (FAILED|PASSED)' $OUT/gpu-tests-$v.log | tail -6
done
echo "t=$(( $(date +%s) - T0 ))"
BINS="dslab dslab-clus dslab-clusbar" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192,16384 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c2:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
python3 scripts/ab_table.py $OUT/ab --base dslab --phases first_block_accumulated,first_segment_last_pair,second_segment_first_accumulated,last_block_accumulated > $OUT/ab-phases.txt 2>&1
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
