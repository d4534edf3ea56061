#!/usr/bin/env bash
# Session 36 call 9: the fixed-role kernel's softmax with fast_exp2 too (dslab) against 7b0db13 (dslab-base) at 16 heads; FlashInfer beside; 128 heads at 32K with 7b0db13's two-warpgroup kernel; the MLA GPU tests of the final build.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} step {r['real_time']:.1f} rf {r.get('roofline_fraction',0):.3f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}")
PY
done; }
A="--model deepseek-v3 --axis heads=16 --axis page_size=64 --timeout 0.2 --axis batch=64,128 --axis kv_len=4096,8192,16384,32768"
AB_LIMIT=150 BINS="dslab dslab-base" bash .device/ab.sh r16 1 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
AB_LIMIT=150 BINS="dslab" bash .device/ab.sh fi16 1 $A --variant mla/flashinfer/cuda > $OUT/ab-fi.log 2>&1
AB_LIMIT=150 BINS="dslab" bash .device/ab.sh h128 1 --model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.2 --axis batch=64,128 --axis kv_len=32768 --variant mla/fused/cuda --variant mla/flashinfer/cuda > $OUT/ab-128.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
