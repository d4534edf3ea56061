#!/usr/bin/env bash
# Session 39 call 3: how much FlashInfer's kernel time over ours moves between runs at the points that decide issue 18
# (128 heads batch 128 at 4K-8K, 16 heads batch 64 at 16K) - three runs each, FlashInfer beside in every run.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json  # (session 38 call 6's calibration of an H100 of this kind)
for r in 1 2 3; do
  timeout 100 dslab run --model deepseek-v3 --variant mla/fused/cuda --variant mla/flashinfer/cuda --axis batch=128 --axis q_len=1 \
      --axis kv_len=4096,8192 --axis heads=128 --axis page_size=64 --timeout 0.4 --machine $OUT/machine.json --out $OUT/h128-$r > $OUT/h128-$r.log 2>&1
  echo "h128 $r exit $?"
  timeout 100 dslab run --model deepseek-v3 --variant mla/fused/cuda --variant mla/flashinfer/cuda --axis batch=64 --axis q_len=1 \
      --axis kv_len=16384 --axis heads=16 --axis page_size=64 --timeout 0.4 --machine $OUT/machine.json --out $OUT/h16-$r > $OUT/h16-$r.log 2>&1
  echo "h16 $r exit $?"
done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
