#!/usr/bin/env bash
# Session 38 call 3: interleaved against the session-37 kernel (dslab-base): dslab-segpre (the next segment's schedule
# entry and length read as a segment's outputs are written, not at the next segment's top: call 2's clocks put ~3 us
# of load latency there), dslab-l2a (copies evict_first), dslab-segl2 (both); 128 heads batch 128 and 64, 16 heads
# batch 128. Then dslab-diag2 (segpre + clocks around the switch, the output staging run twice to see a cold first
# pass) and dslab-segpre's MLA GPU tests.
set -u
T0=$(date +%s)
dslab-base calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192,16384 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab-base dslab-segpre dslab-l2a dslab-segl2" bash .device/ab.sh h128 3 $A --axis heads=128 --axis batch=128,64 > $OUT/ab128.log 2>&1
AB_LIMIT=100 BINS="dslab-base dslab-segpre" bash .device/ab.sh h16 2 $A --axis heads=16 --axis batch=128 > $OUT/ab16.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
for r in 1 2; do timeout 60 dslab-diag2 run $A --axis heads=128 --axis batch=128 --machine $OUT/machine.json --out $OUT/diag-$r > $OUT/diag-$r.log 2>&1; echo "diag exit $?"; done
echo "t=$(( $(date +%s) - T0 ))"
DSLAB_BINARY=$(command -v dslab-segpre) timeout 110 dslab_tests-segpre --gtest_filter='*GpuMla*' > $OUT/gpu-tests-segpre.log 2>&1
echo "tests exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-segpre.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
