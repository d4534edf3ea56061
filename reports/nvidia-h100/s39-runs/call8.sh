#!/usr/bin/env bash
# Session 39 call 8: merge_splits_kernel waiting per request on counts the fixed-role kernel publishes, not on the
# decode grid's end (dslab; dslab-grid: the same tree with the merge waiting on the grid as before). GPU tests, the
# 16-head sanitizer points, kernel time interleaved at 16 heads, then roofline-v3 with FlashInfer beside.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
GPU_TESTS_FILTER='*GpuMla*:*GpuLayer*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=100 scripts/device_run.sh sanitize:memcheck-mla-fused-16h,racecheck-mla-fused-16h > /dev/null 2>&1
cat $OUT/sanitize.txt | tail -3
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,16384 --axis heads=16 --axis batch=64,128 --variant mla/fused/cuda"
AB_LIMIT=60 BINS="dslab dslab-grid" bash .device/ab.sh merge 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
SWEEP_LIMIT=150 GPU_TIMEOUT=0.4 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda" scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
grep -E "sweep|exit" $OUT/run.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
