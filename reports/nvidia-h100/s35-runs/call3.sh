#!/usr/bin/env bash
# Session 35 call 3 (f49a095): kv-dtype-v3 at 16 heads (the softmax helper's kernels), roofline-v3 with FlashInfer.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
timeout 90 dslab run --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=64,128 --axis q_len=1,2 --axis kv_len=4096 --axis page_size=64 --timeout 0.2 --machine $OUT/machine.json --out $OUT/probe > $OUT/probe.log 2>&1; echo "probe rc $?"
python3 - $OUT/probe/results.json <<'PY'
import json,sys
for r in json.load(open(sys.argv[1]))['benchmarks']:
    c=r['counters']; nm='/'.join(x for x in r['name'].split('/')[1:] if x.split(':')[0] in ('heads','batch','q_len','kv_len'))
    print(nm, f"kernel {c.get('kernel_s',0)*1e6:.1f} ver {r.get('verify_pass')}", {k[16:]:round(v,2) for k,v in c.items() if k[16:] in ('per_block','first_block_accumulated','done','q_landed')}, 'ghz', round(c.get('decode_phase.sm_ghz',0),2), 'blocks', c.get('decode_phase.blocks'))
PY
echo "t=$(( $(date +%s) - T0 ))"
RUN_ARGS="--variant mla/fused/cuda --axis heads=16 --axis kv_len=4096,8192,16384,32768" GPU_TIMEOUT=0.3 SWEEP_LIMIT=230 scripts/device_run.sh sweep:mla-decode:kv-dtype-v3 > /dev/null 2>&1
tail -1 $OUT/run.log
[ -f $OUT/mla-decode-kv-dtype-v3/results.json ] && python3 .device/show.py $OUT/mla-decode-kv-dtype-v3/results.json | grep -v "^    "
echo "t=$(( $(date +%s) - T0 ))"
GPU_TIMEOUT=0.4 SWEEP_LIMIT=330 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda" scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
tail -1 $OUT/run.log
[ -f $OUT/mla-decode-roofline-v3/results.json ] && python3 .device/show.py $OUT/mla-decode-roofline-v3/results.json | grep -v "^    "
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
ls $OUT
