#!/usr/bin/env bash
# Session 35 call 1: GPU tests (softmax_to_pt / PartClocks refactor, switch prefetch), A/B 128h b128 switch prefetch, A/B 16h fp8/int8, memcheck.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1; grep -i "read\|TB/s" $OUT/cal.log | head -3
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
    keep=('per_block','q_landed','first_block_accumulated','first_segment_accumulated','first_segment_written','second_segment_q_landed','second_segment_first_accumulated','done','last_done')
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    nm='/'.join(x for x in r['name'].split('/')[1:] if x.split(':')[0] in ('heads','batch','kv_len','kv_dtype'))
    print(sys.argv[1].split('/')[-2], nm, f"step {r['real_time']:.1f} kernel {c.get('kernel_s',0)*1e6:.1f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} err {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
AB_LIMIT=120 BINS="dslab dslab-base dslab-k0 dslab-k14" bash .device/ab.sh sw 2 --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=128 --axis kv_len=4096,8192 --axis page_size=64 --timeout 0.3 > $OUT/ab-sw.log 2>&1
grep -h "exit" $OUT/ab-sw.log | sort | uniq -c
P $OUT/ab/sw-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
AB_LIMIT=120 BINS="dslab dslab-base" bash .device/ab.sh q 1 --model deepseek-v3 --variant mla/fused/cuda --axis heads=16 --axis batch=64 --axis kv_len=8192,32768 --axis kv_dtype=fp8_e4m3,int8 --timeout 0.3 > $OUT/ab-q.log 2>&1
grep -h "exit" $OUT/ab-q.log | sort | uniq -c
P $OUT/ab/q-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=150 scripts/device_run.sh sanitize:memcheck-mla-fused-v3,memcheck-mla-fused-quantised > /dev/null 2>&1
tail -4 $OUT/sanitize.txt
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
ls $OUT
