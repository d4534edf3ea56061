#!/usr/bin/env bash
# Session 40 call 8: the new A/B tooling end to end (scripts/kernel_variant.sh binaries, device_run.sh's ab step,
# scripts/ab_table.py) - dslab-null: fused_seesaw.cu rebuilt without a flag (the A/B's noise floor: the same code
# under another name); dslab-ef160: fused.cu with DSLAB_EVICT_FIRST_BLOCKS=160, so that 8K keys' segments (129
# blocks) get the evict_first hint too; against 4c7aa1b's build (dslab), interleaved, 3 rounds at 128 heads.
set -u
T0=$(date +%s)
cp .device/machine.json $OUT/machine.json
BINS="dslab dslab-null dslab-ef160" AB_LIMIT=100 \
AB_ARGS="--model deepseek-v3 --variant mla/fused/cuda --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192 --axis heads=128 --axis batch=128,64" \
  scripts/device_run.sh ab:c8:3 > /dev/null 2>&1
grep -c "exit 0" $OUT/run.log
python3 scripts/ab_table.py $OUT/ab --base dslab > $OUT/ab-table.txt 2>&1; echo "ab_table exit $?"; cat $OUT/ab-table.txt
echo "t=$(( $(date +%s) - T0 ))"
scripts/device_run.sh pack > /dev/null 2>&1
