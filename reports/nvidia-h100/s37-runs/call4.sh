#!/usr/bin/env bash
# Session 37 call 4: the final tree's MLA GPU tests (a 96-head case added: a part-filled tile's outputs copied out by
# threads); the lone-block pair's parts (dslab-diag: clocks inside the first segment's last pair); roofline-v3 with
# FlashInfer beside; memcheck and racecheck of the fused kernel at 96 and 128 heads.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
timeout 60 dslab-diag run --model deepseek-v3 --axis heads=128 --axis page_size=64 --axis batch=128,64 --axis kv_len=4096 --timeout 0.1 --variant mla/fused/cuda --out $OUT/diag > $OUT/diag.log 2>&1
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
echo "sweep exit $?"; ls $OUT
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=130 scripts/device_run.sh sanitize:memcheck-mla-fused-v3,racecheck-mla-fused-v3 > /dev/null 2>&1
tail -3 $OUT/sanitize.txt
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
