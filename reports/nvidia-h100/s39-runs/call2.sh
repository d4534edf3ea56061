#!/usr/bin/env bash
# Session 39 call 2: the merged tree (dslab, 47c7aa0) interleaved against three switch experiments and their sum -
# dslab-qel1: the next Q's L2 prefetch evict_last; dslab-ro: each warpgroup's first thread stores its own output tiles
# and awaits their read-out just before its copies into stage 1 (no CTA barrier waits on it); dslab-xr: the CTA's exit
# awaits its stores' shared-memory read-out only; dslab-all: the three - then dslab-all's MLA GPU tests.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (session 38 call 6's calibration of an H100 of this kind)
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-qel1 dslab-ro dslab-xr dslab-all" bash .device/ab.sh sw 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
DSLAB_BINARY=$(command -v dslab-all) timeout 150 dslab_tests-all --gtest_filter='*GpuMla*' > $OUT/gpu-tests-all.log 2>&1
echo "tests exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-all.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
