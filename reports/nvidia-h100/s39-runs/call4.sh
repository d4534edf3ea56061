#!/usr/bin/env bash
# Session 39 call 4: where the slowest CTAs lose time (new spread counters: done_p10 / done_p90 / per_block_min /
# per_block_max beside the medians and last_done) at the points that decide issue 18, and whether another split
# count balances the 16-head 16K point better (kv_splits 128 / 132 = auto / 264 / 396, FlashInfer beside); then the
# MLA GPU tests (their phase test asserts the new counters' order).
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (session 38 call 6's calibration of an H100 of this kind)
C="--model deepseek-v3 --axis q_len=1 --axis page_size=64 --timeout 0.4 --machine $OUT/machine.json"
for r in 1 2; do
  timeout 100 dslab run $C --variant mla/fused/cuda --axis batch=64 --axis kv_len=16384 --axis heads=16 --axis kv_splits=auto,128,264,396 --out $OUT/split16-$r > $OUT/split16-$r.log 2>&1
  echo "split16 $r exit $?"
  timeout 100 dslab run $C --variant mla/flashinfer/cuda --axis batch=64 --axis kv_len=16384 --axis heads=16 --out $OUT/fi16-$r > $OUT/fi16-$r.log 2>&1
  echo "fi16 $r exit $?"
done
timeout 100 dslab run $C --variant mla/fused/cuda --variant mla/flashinfer/cuda --axis batch=128 --axis kv_len=4096,8192 --axis heads=128 --out $OUT/h128 > $OUT/h128.log 2>&1
echo "h128 exit $?"
echo "t=$(( $(date +%s) - T0 ))"
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
