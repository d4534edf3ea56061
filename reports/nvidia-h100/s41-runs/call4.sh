#!/usr/bin/env bash
# Session 41 call 4: the standing checks of 9c79292 (the tidied seesaw kernel, md5-identical to call 3's dslab-tidy):
# the MLA and layer GPU tests, memcheck and racecheck of the 128-head fused point, then roofline-v3 with FlashInfer
# beside, three passes.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
GPU_TESTS_FILTER='*GpuMla*:*GpuLayer*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=130 scripts/device_run.sh sanitize:memcheck-mla-fused-v3,racecheck-mla-fused-v3 > /dev/null 2>&1
tail -4 $OUT/sanitize.txt
echo "t=$(( $(date +%s) - T0 ))"
left=$(( 540 - ($(date +%s) - T0) ))
SWEEP_LIMIT=$left GPU_TIMEOUT=0.4 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda --repetitions 3" \
  scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
grep -E "sweep|exit" $OUT/run.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
