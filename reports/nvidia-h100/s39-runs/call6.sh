#!/usr/bin/env bash
# Session 39 call 6: the 16-head kernel's parts weighted by each SM's measured block rate (dslab-smw,
# s39-runs/experiment-sm-weights.diff: the CTA takes part %smid, the plan gives each part blocks in proportion to its
# SM's speed, the rates read from DSLAB_SM_WEIGHTS). The rates are measured first on this machine (DSLAB_SM_RATES, two
# runs at 16 heads batch 64 16K), then equal parts (no file) and weighted parts are interleaved, FlashInfer beside.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
C="--model deepseek-v3 --axis q_len=1 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --axis heads=16"
for r in 1 2; do
  DSLAB_SM_RATES=1 timeout 100 dslab-smw run $C --variant mla/fused/cuda --axis batch=64 --axis kv_len=16384 --out $OUT/rates-$r > $OUT/rates-$r.log 2>&1
  echo "rates $r exit $?"
done
python3 .device/sm_weights.py $OUT/rates-1.log $OUT/rates-2.log > $OUT/sm_rates.txt
echo "rates: $(wc -l < $OUT/sm_rates.txt) SMs"
P="--axis batch=64,128 --axis kv_len=8192,16384"
for r in 1 2 3; do
  timeout 100 dslab-smw run $C --variant mla/fused/cuda $P --out $OUT/equal-$r > $OUT/equal-$r.log 2>&1
  echo "equal $r exit $?"
  DSLAB_SM_WEIGHTS=$OUT/sm_rates.txt timeout 100 dslab-smw run $C --variant mla/fused/cuda $P --out $OUT/weighted-$r > $OUT/weighted-$r.log 2>&1
  echo "weighted $r exit $?"
  timeout 100 dslab-smw run $C --variant mla/flashinfer/cuda $P --out $OUT/fi-$r > $OUT/fi-$r.log 2>&1
  echo "fi $r exit $?"
done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
