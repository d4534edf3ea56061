#!/usr/bin/env bash
# Session 35 call 4 (2c2f5d7): Nsight Compute on the 128-head batch-128 8K point, our two-warpgroup kernel and FlashInfer's.
set -u
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
P="--model,deepseek-v3,--axis,heads=128,--axis,batch=128,--axis,kv_len=8192,--axis,page_size=64,--axis,executor=eager"
export NCU_LAUNCHES=1 NCU_LIMIT=200 NCU_SECTIONS="ComputeWorkloadAnalysis SchedulerStats InstructionStats"
scripts/device_run.sh "ncu:decode_kernel:--variant,mla/fused/cuda,$P" "ncu:BatchMLAPageAttentionHopperKernel:--variant,mla/flashinfer/cuda,$P" > /dev/null 2>&1
for f in $OUT/ncu-*.txt; do echo "== $f"; grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Executed Ipc|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|Shared Memory|Bank|Registers Per|Block Size|Grid Size|Pipe|stall" $f | head -60; done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
ls $OUT
