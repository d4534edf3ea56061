#!/usr/bin/env bash
# Session 40 call 4: warpgroup 0's first Q K^T of a padded segment (the padding block, masked whole) cut to the rope
# tile's 4 MMAs from 36, so warpgroup 1's first block is scored alone on the tensor cores (dslab-skip), against
# 81690d0 (dslab), interleaved, 3 rounds at 128 heads; the MLA GPU tests and memcheck with dslab-skip.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 200 $(command -v dslab_tests-skip) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-skip.log 2>&1
echo "gpu tests (skip) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-skip.log | head
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-skip" bash .device/ab.sh skip 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 dslab-skip run --model deepseek-v3 --variant mla/fused/cuda \
    --axis batch=3 --axis q_len=1,2 --axis kv_len=4096,4110 --axis heads=128 --axis page_size=64 --axis kv_splits=1 --min-samples 1 --min-time 0 --timeout 0.01 --out $OUT/memcheck > $OUT/memcheck-skip.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck-skip.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
