#!/usr/bin/env bash
# Session 40 call 5: a whole request's outputs staged in stage 0, not stage 1 (dslab-os0): with the padding block
# first, a padded next segment's block 1 (its first real one) is then copied into stage 1 as soon as the last pair's
# products are done, and the zero box waits for the stores' read-out instead; against 81690d0 (dslab), interleaved,
# 3 rounds at 128 heads; the MLA GPU tests and memcheck with dslab-os0.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 200 $(command -v dslab_tests-os0) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-os0.log 2>&1
echo "gpu tests (os0) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-os0.log | head
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-os0" bash .device/ab.sh os 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 dslab-os0 run --model deepseek-v3 --variant mla/fused/cuda \
    --axis batch=3 --axis q_len=1,2 --axis kv_len=4096,4110 --axis heads=128 --axis page_size=64 --axis kv_splits=1 --min-samples 1 --min-time 0 --timeout 0.01 --out $OUT/memcheck > $OUT/memcheck-os0.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck-os0.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
