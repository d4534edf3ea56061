#!/usr/bin/env bash
# Session 40 call 3: the standing checks of 81690d0 (the padding block walked first): the MLA and layer GPU tests,
# roofline-v3 with FlashInfer beside, memcheck and racecheck of the 128-head fused point; then 81690d0 against the
# tree before it (dslab-base), interleaved, 2 more rounds at 128 heads.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (session 38 call 6's calibration of an H100 of this kind)
GPU_TESTS_FILTER='*GpuMla*:*GpuLayer*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
SWEEP_LIMIT=170 GPU_TIMEOUT=0.4 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda" scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
grep -E "sweep|exit" $OUT/run.log | tail -3
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=120 scripts/device_run.sh sanitize:memcheck-mla-fused-v3,racecheck-mla-fused-v3 > /dev/null 2>&1
cat $OUT/sanitize.txt | tail -4
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab dslab-base" bash .device/ab.sh final 2 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
