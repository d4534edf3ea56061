#!/usr/bin/env bash
# Session 39 call 7: did call 6's weighted parts reach the kernel? dslab-smw with both DSLAB_SM_WEIGHTS and
# DSLAB_SM_RATES: each CTA's SM and block count against its SM's weight, and the per-SM rates of the weighted runs
# against those they were weighted by.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
C="--model deepseek-v3 --axis q_len=1 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --axis heads=16 --variant mla/fused/cuda --axis batch=64 --axis kv_len=16384"
for r in 1 2; do
  DSLAB_SM_RATES=1 timeout 100 dslab-smw run $C --out $OUT/rates-$r > $OUT/rates-$r.log 2>&1
  echo "rates $r exit $?"
done
python3 .device/sm_weights.py $OUT/rates-1.log $OUT/rates-2.log > $OUT/sm_rates.txt
for r in 1 2 3; do
  DSLAB_SM_RATES=1 timeout 100 dslab-smw run $C --out $OUT/equal-$r > $OUT/equal-$r.log 2>&1
  echo "equal $r exit $?"
  DSLAB_SM_RATES=1 DSLAB_SM_WEIGHTS=$OUT/sm_rates.txt timeout 100 dslab-smw run $C --out $OUT/weighted-$r > $OUT/weighted-$r.log 2>&1
  echo "weighted $r exit $?"
done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
