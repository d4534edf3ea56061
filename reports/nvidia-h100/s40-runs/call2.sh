#!/usr/bin/env bash
# Session 40 call 2: an odd segment's padding block walked first (dslab-padfirst: block 0 is the zero box, masked
# whole, so the last pair holds two real blocks and a switch's first pair needs one block from memory, not two)
# against the tree's kernel (dslab-base) and call 1's dslab-both, interleaved, 3 rounds; FlashInfer once beside; the
# MLA GPU tests and memcheck with dslab-padfirst; the SM clock and board power sampled (nvidia-smi, 10 ms) while
# our kernel's and FlashInfer's steps run, one after the other, at 128 heads batch 128 4K.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 200 $(command -v dslab_tests-padfirst) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-padfirst.log 2>&1
echo "gpu tests (padfirst) exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-padfirst.log | head
echo "t=$(( $(date +%s) - T0 ))"
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab-base dslab-padfirst dslab-both" bash .device/ab.sh pf 3 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
timeout 100 dslab-base run --model deepseek-v3 --variant mla/flashinfer/cuda --axis batch=128,64 --axis q_len=1 --axis kv_len=4096,8192 \
    --axis heads=128 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --out $OUT/fi > $OUT/fi.log 2>&1
echo "fi exit $?"
echo "t=$(( $(date +%s) - T0 ))"
Q=clocks.sm,power.draw,clocks_event_reasons.active
nvidia-smi --query-gpu=timestamp,$Q --format=csv,noheader,nounits > /dev/null 2>&1 || Q=clocks.sm,power.draw,clocks_throttle_reasons.active
nvidia-smi --query-gpu=timestamp,$Q --format=csv,noheader,nounits -lms 10 > $OUT/smi.csv 2> $OUT/smi.err &
SMI=$!
for r in 1 2; do
  for v in fused flashinfer; do
    echo "start $v $r $(date +%s.%N)" >> $OUT/power-marks.txt
    timeout 60 dslab-base run --model deepseek-v3 --variant mla/$v/cuda --axis batch=128 --axis kv_len=4096 --axis heads=128 --axis page_size=64 \
        --min-time 4 --timeout 6 --machine $OUT/machine.json --out $OUT/power-$v-$r > $OUT/power-$v-$r.log 2>&1
    echo "end $v $r $(date +%s.%N) exit $?" >> $OUT/power-marks.txt
  done
done
kill $SMI
cat $OUT/power-marks.txt; wc -l $OUT/smi.csv
echo "t=$(( $(date +%s) - T0 ))"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 1 dslab-padfirst run --model deepseek-v3 --variant mla/fused/cuda \
    --axis batch=3 --axis q_len=1,2 --axis kv_len=4096,4110 --axis heads=128 --axis page_size=64 --axis kv_splits=1 --min-samples 1 --min-time 0 --timeout 0.01 --out $OUT/memcheck > $OUT/memcheck-padfirst.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck-padfirst.log | tail -2
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
