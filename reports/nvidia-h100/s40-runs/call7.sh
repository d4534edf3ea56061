#!/usr/bin/env bash
# Session 40 call 7: the next segment's Q sooner at a switch - dslab-eq: its tiles 0-7 copied by warpgroup 1 as it
# enters the last pair (warpgroup 0 has then passed its last Q K^T), not by warpgroup 0 after warpgroup 1's softmax;
# dslab-qel: the next Q's L2 prefetch at the segment's top evict_last (session 39's qel1, now with the padding block
# first); dslab-eqqel: both; against 81690d0 (dslab), interleaved, 3 rounds at 128 heads; GPU tests and memcheck
# with dslab-eq.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 200 $(command -v dslab_tests-eq) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-eq.log 2>&1
echo "gpu tests (eq) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-eq.log | head
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-eq dslab-qel dslab-eqqel" bash .device/ab.sh q 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 dslab-eq run --model deepseek-v3 --variant mla/fused/cuda \
    --axis batch=3 --axis q_len=1,2 --axis kv_len=4096,4110 --axis heads=128 --axis page_size=64 --axis kv_splits=1 --min-samples 1 --min-time 0 --timeout 0.01 --out $OUT/memcheck > $OUT/memcheck-eq.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck-eq.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
