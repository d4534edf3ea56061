#!/usr/bin/env bash
# Session 41 call 1: (1) dslab-onepair (fused_seesaw.cu with -DDSLAB_ONE_PAIR: a segment's last pair run by the pairs'
# loop's own code, a run-time flag, instead of its own instance - 6040 instructions an instance against 7832, so the
# switch fetches less cold code) GPU-tested, then (2) timed interleaved against this tree's dslab, with dslab-halfbox
# (fused.cu + fused_seesaw.cu with -DDSLAB_HALF_BOX: each row tile copies only its half of every block - 32 keys - the
# L2->SM traffic a two-CTA TMA multicast would leave, without its cross-CTA waits; results wrong, hence --no-verify:
# the bound of what multicast could gain); (3) a kv_len scan at 128 heads, ours and FlashInfer's, to split each
# kernel's time into a fixed part and a per-block rate.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
timeout 200 $(command -v dslab_tests-onepair) --gtest_filter='*GpuMla*' > $OUT/gpu-tests-onepair.log 2>&1
echo "onepair GpuMla exit $?"; grep -E '^\[  (FAILED|PASSED)' $OUT/gpu-tests-onepair.log | tail -6
echo "t=$(( $(date +%s) - T0 ))"
BINS="dslab dslab-onepair dslab-halfbox" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --no-verify --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c1:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
timeout 170 dslab run --model deepseek-v3 --variant mla/fused/cuda --variant mla/flashinfer/cuda --axis heads=128 --axis batch=128,64 \
  --axis page_size=64 --axis kv_len=2048,3072,4096,6144,8192,12288,16384 --timeout 0.3 --machine $OUT/machine.json --out $OUT/scan > $OUT/scan.log 2>&1
echo "scan exit $?"; tail -3 $OUT/scan.log
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
exit 0
