#!/usr/bin/env bash
# Session 36 calls 5 and 6 (5: the first build, which hung; 6: the mended one): the three-warpgroup kernel (dslab-qreg: Q latent in the scorer's registers, three latent stages, two multipliers) against the split-role (dslab-split) and two-warpgroup (dslab) kernels; MLA GPU tests of dslab-qreg.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
timeout 60 dslab-qreg run --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=3 --axis q_len=1,2 --axis kv_len=700,5000 --axis page_size=64 --axis len_dist=mixed --axis executor=eager --axis kv_splits=auto,7 --timeout 0.1 --out $OUT/quick > $OUT/quick.log 2>&1
rc=$?; echo "quick rc $rc"; grep -c "verify PASS" $OUT/quick.log; grep -E "FAIL|rror" $OUT/quick.log | cut -c1-200 | head -5
[ $rc -eq 0 ] || { cd $OUT && tar cJf /tmp/o.tar.xz . && mv /tmp/o.tar.xz $OUT/out.tar.xz; exit 1; }
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','first_block_accumulated','last_block_accumulated','done','last_done')
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    a=r['axes']
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} dec {c.get('op_us.decode',0):.1f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --variant mla/fused/cuda --axis batch=128,64 --axis kv_len=4096,8192,16384"
AB_LIMIT=200 BINS="dslab dslab-split dslab-qreg" bash .device/ab.sh a 1 $A > $OUT/ab.log 2>&1
grep -h exit $OUT/ab.log | sort | uniq -c
P $OUT/ab/a-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
DSLAB_BINARY=$(command -v dslab-qreg) timeout 240 dslab_tests-qreg --gtest_filter="*GpuMla*" > $OUT/gpu-tests-qreg.log 2>&1
echo "tests rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-qreg.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
