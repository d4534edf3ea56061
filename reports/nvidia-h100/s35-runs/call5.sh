#!/usr/bin/env bash
# Session 35 call 5 (2c2f5d7): Nsight Compute, full set with source counters, 128 heads batch 128 8K: our two-warpgroup
# kernel and FlashInfer's Hopper MLA kernel (where the warps stall, by instruction).
set -u
T0=$(date +%s)
A="--model deepseek-v3 --axis heads=128 --axis batch=128 --axis kv_len=8192 --axis page_size=64 --axis executor=eager"
for k in "seesaw:decode_kernel:mla/fused/cuda" "fi:BatchMLAPageAttentionHopperKernel:mla/flashinfer/cuda"; do
  IFS=: read -r tag kernel variant <<<"$k"
  timeout 240 ncu --clock-control none -k regex:$kernel --launch-skip 2 --launch-count 1 --set full --import-source yes -o $OUT/$tag \
    dslab run $A --variant $variant --no-verify --min-samples 1 --min-time 0 --timeout 0.2 --out $OUT/run-$tag > $OUT/ncu-$tag.log 2>&1
  echo "$tag ncu rc $?"; tail -2 $OUT/ncu-$tag.log
  ncu -i $OUT/$tag.ncu-rep --page details > $OUT/$tag-details.txt 2>&1
  ncu -i $OUT/$tag.ncu-rep --page raw --csv 2>/dev/null | xz > $OUT/$tag-raw.csv.xz
  ncu -i $OUT/$tag.ncu-rep --page source --csv --print-source sass 2>/dev/null | xz > $OUT/$tag-sass.csv.xz
  grep -E "Duration|SM Frequency|Issue Slots Busy|Eligible Warps|No Eligible|DRAM Throughput|highest-utilized|Warp Cycles Per Issued" $OUT/$tag-details.txt | head -12
  rm -rf $OUT/$tag.ncu-rep $OUT/run-$tag
  echo "t=$(( $(date +%s) - T0 ))"
done
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
ls $OUT
