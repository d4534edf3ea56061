#!/usr/bin/env bash
# Session 37 call 6: the final tree's MLA GPU tests (the phase test now orders the switch's new phases); the lone
# block's pair in the first segment, clock by clock (dslab-diag: experiment-tail-clocks.diff, both warpgroups);
# roofline-v3 with FlashInfer beside, the final tree.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
timeout 60 dslab-diag run --model deepseek-v3 --axis heads=128 --axis page_size=64 --axis batch=128,64 --axis kv_len=4096,8192 --timeout 0.1 --variant mla/fused/cuda --out $OUT/diag > $OUT/diag.log 2>&1
echo "diag exit $?"
python3 - $OUT/diag/results.json <<'PY'
import json,sys
for r in json.load(open(sys.argv[1]))['benchmarks']:
    c=r['counters']; a=r['axes']
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.') and ('x_' in k or 'segment' in k or 'accumulated' in k)}
    print(a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} ver {r.get('verify_pass')}", dict(sorted(ph.items(), key=lambda t: t[1])))
PY
echo "t=$(( $(date +%s) - T0 ))"
SWEEP_LIMIT=290 GPU_TIMEOUT=0.4 RUN_ARGS="--variant mla/fused/cuda --variant mla/flashinfer/cuda" scripts/device_run.sh sweep:mla-decode:roofline-v3 > /dev/null 2>&1
echo "sweep exit $?"
python3 - $OUT/mla-decode-roofline-v3/results.json <<'PY'
import json,sys
rows={}
for r in json.load(open(sys.argv[1]))['benchmarks']:
    a=r['axes']; c=r['counters']; v=r['variant'].split('/')[1]
    rows.setdefault((a['heads'],a['batch'],a['kv_len']),{})[v]=(c.get('kernel_s',0)*1e6, r['real_time'], r.get('roofline_fraction',0), r.get('verify_pass'))
for k in sorted(rows):
    f=rows[k].get('fused'); fi=rows[k].get('flashinfer')
    if f and fi: print(k, f"fused k {f[0]:.1f} step {f[1]:.1f} rf {f[2]:.3f} ver {f[3]} | fi k {fi[0]:.1f} step {fi[1]:.1f} ver {fi[3]} | fi/ours kernel {fi[0]/f[0]:.3f} step {fi[1]/f[1]:.3f}")
PY
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
