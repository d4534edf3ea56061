#!/usr/bin/env bash
# Session 35 call 2: the fp8 kernel's start (page-table entries read together; dslab-s2: + blocks 2-3 after block 0 lands)
# against f49a095 (dslab-base); GPU tests; racecheck of the quantised kernels after the softmax helper; kv-dtype-v3.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
GPU_TESTS_FILTER="*GpuMla*" GPU_TESTS_LIMIT=200 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head -30
grep -B2 -A3 "Failure" $OUT/gpu-tests.log | head -30
echo "t=$(( $(date +%s) - T0 ))"
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','q_landed','loads_issued','first_block_landed','first_block_accumulated','done','last_done','wait')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    nm='/'.join(x for x in r['name'].split('/')[1:] if x.split(':')[0] in ('heads','batch','kv_len','kv_dtype'))
    print(sys.argv[1].split('/')[-2], nm, f"step {r['real_time']:.1f} kernel {c.get('kernel_s',0)*1e6:.1f} decode {c.get('op_us.decode',0):.1f} ver {r.get('verify_pass')} err {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
AB_LIMIT=120 BINS="dslab dslab-s2 dslab-base" bash .device/ab.sh st 2 --model deepseek-v3 --variant mla/fused/cuda --axis heads=16 --axis batch=64 --axis kv_len=4096,8192,32768 --axis kv_dtype=fp8_e4m3 --timeout 0.3 > $OUT/ab-st.log 2>&1
grep -h "exit" $OUT/ab-st.log | sort | uniq -c
P $OUT/ab/st-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=150 scripts/device_run.sh sanitize:racecheck-mla-fused-quantised,memcheck-mla-fused-quantised > /dev/null 2>&1
tail -4 $OUT/sanitize.txt
grep -oE "(Read|Write) access at [A-Za-z_0-9:<>]+" $OUT/sanitize/racecheck-mla-fused-quantised.log | awk '{print $4}' | sed 's/+0x.*//' | sort | uniq -c | sort -rn | head
grep -c "Race reported" $OUT/sanitize/racecheck-mla-fused-quantised.log
echo "t=$(( $(date +%s) - T0 ))"
RUN_ARGS="--variant mla/fused/cuda --axis heads=16 --axis kv_len=4096,8192,16384,32768" GPU_TIMEOUT=0.3 SWEEP_LIMIT=200 scripts/device_run.sh sweep:mla-decode:kv-dtype-v3 > /dev/null 2>&1
tail -1 $OUT/run.log
[ -f $OUT/mla-decode-kv-dtype-v3/results.json ] && P $OUT/mla-decode-kv-dtype-v3/results.json
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
ls $OUT
