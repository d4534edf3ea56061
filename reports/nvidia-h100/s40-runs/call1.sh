#!/usr/bin/env bash
# Session 40 call 1: the last pair cut to its work at 128 heads - dslab-trim: an odd segment's padding block's P V
# products skipped and a last block of <= 16 keys multiplied over its first k16 step only; dslab-both: and the padding
# block's Q K^T skipped in the pairs' loop (its scores are masked whole) - interleaved against the tree's kernel
# (dslab-base, identical to dslab); FlashInfer once beside; the MLA GPU tests with both changes (new cases: 4096 + 1
# and 4110 + 2 keys, whole requests); memcheck of the 128-head fused point with both.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (session 38 call 6's calibration of an H100 of this kind)
timeout 200 $(command -v dslab_tests-both) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-both.log 2>&1
echo "gpu tests (both) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-both.log | head
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab-base dslab-trim dslab-both" bash .device/ab.sh tail 2 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
timeout 100 dslab-base run --model deepseek-v3 --variant mla/flashinfer/cuda --axis batch=128,64 --axis q_len=1 --axis kv_len=4096,8192 \
    --axis heads=128 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --out $OUT/fi > $OUT/fi.log 2>&1
echo "fi exit $?"
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 dslab-both run --model deepseek-v3 --variant mla/fused/cuda \
    --axis batch=3 --axis q_len=1,2 --axis kv_len=4096,4110 --axis heads=128 --axis page_size=64 --axis kv_splits=1 --min-samples 1 --min-time 0 --timeout 0.01 --out $OUT/memcheck > $OUT/memcheck-both.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck-both.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
