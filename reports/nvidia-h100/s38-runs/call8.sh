#!/usr/bin/env bash
# Session 38 call 8: an odd segment padded with one block past its end (copied as zeros from a box before slot 0,
# masked), so that every segment ends in the same last pair and the kernel drops two tail instances (dslab-pad,
# 7944 instructions against 12600) - interleaved against the final tree (dslab); then dslab-pad's MLA GPU tests.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (call 6's calibration of an H100 of this kind)
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192,16384 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-pad" bash .device/ab.sh pad 2 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
DSLAB_BINARY=$(command -v dslab-pad) timeout 120 dslab_tests-pad --gtest_filter='*GpuMla*' > $OUT/gpu-tests-pad.log 2>&1
echo "tests exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-pad.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
