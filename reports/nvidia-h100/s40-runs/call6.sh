#!/usr/bin/env bash
# Session 40 call 6: roofline-v3 with FlashInfer beside, three passes (--repetitions 3), 81690d0: how far each point's
# ratio moves from pass to pass on one machine.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
SWEEP_LIMIT=450 GPU_TIMEOUT=0.4 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda --repetitions 3" scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
grep -E "sweep|exit" $OUT/run.log | tail -3
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
