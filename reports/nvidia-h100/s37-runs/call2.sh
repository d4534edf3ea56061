#!/usr/bin/env bash
# Session 37 call 2: where the two-warpgroup kernel's segment switch goes (new phases: the first segment's last pairs
# entered, its row sums exchanged, its stores issued, the second segment's first blocks scored), dslab (lazy max +
# the phases) against dslab-base (71cffaf), interleaved; the MLA GPU tests of dslab.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.')}
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --axis batch=128,64 --axis kv_len=4096,8192"
AB_LIMIT=200 BINS="dslab dslab-base" bash .device/ab.sh d 2 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
