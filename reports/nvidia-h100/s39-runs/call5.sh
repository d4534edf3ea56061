#!/usr/bin/env bash
# Session 39 call 5: is a CTA's block rate a property of the SM it runs on? dslab-smid (s39-runs/experiment-sm-rates.diff:
# the 16-head kernel records %smid; DSLAB_SM_RATES=1 prints each CTA's SM, blocks, per-block us and end) over repeated
# runs of the 16-head points, to correlate the per-SM rates between runs.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
C="--model deepseek-v3 --axis q_len=1 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --variant mla/fused/cuda --axis heads=16"
for r in 1 2 3; do
  DSLAB_SM_RATES=1 timeout 100 dslab-smid run $C --axis batch=64 --axis kv_len=16384 --out $OUT/b64k16-$r > $OUT/b64k16-$r.log 2>&1
  echo "b64k16 $r exit $?"
  DSLAB_SM_RATES=1 timeout 100 dslab-smid run $C --axis batch=128 --axis kv_len=8192 --out $OUT/b128k8-$r > $OUT/b128k8-$r.log 2>&1
  echo "b128k8 $r exit $?"
done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
