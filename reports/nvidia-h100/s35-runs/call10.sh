#!/usr/bin/env bash
# Session 35 call 10: the 128-head kernel with split roles (dslab-split, DSLAB_SEESAW_SPLIT=1): verify, GPU tests, A/B, memcheck.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
timeout 90 dslab-split run --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=3 --axis q_len=1,2 --axis kv_len=700 --axis page_size=64 --axis len_dist=mixed --axis executor=eager --timeout 0.1 --out $OUT/quick > $OUT/quick.log 2>&1
rc=$?; echo "quick rc $rc"; grep -E "verify|FAIL|rror" $OUT/quick.log | cut -c1-200 | head -8
[ $rc -eq 0 ] || { cd $OUT && tar cJf /tmp/o.tar.xz . && mv /tmp/o.tar.xz $OUT/out.tar.xz; exit 1; }
DSLAB_BINARY=$(command -v dslab-split) timeout 240 dslab_tests-split --gtest_filter="*GpuMla*" > $OUT/gpu-tests-split.log 2>&1
echo "tests rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-split.log | head; grep -B2 -A4 "Failure" $OUT/gpu-tests-split.log | head -30
echo "t=$(( $(date +%s) - T0 ))"
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','first_block_accumulated','q_landed','done','last_done')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    nm='/'.join(x for x in r['name'].split('/')[1:] if x.split(':')[0] in ('heads','batch','kv_len'))
    print(sys.argv[1].split('/')[-2], nm, f"step {r['real_time']:.1f} kernel {c.get('kernel_s',0)*1e6:.1f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
AB_LIMIT=150 BINS="dslab dslab-split" bash .device/ab.sh sp 2 --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=64,128 --axis kv_len=4096,8192 --axis page_size=64 --timeout 0.3 > $OUT/ab-sp.log 2>&1
grep -h "exit" $OUT/ab-sp.log | sort | uniq -c
P $OUT/ab/sp-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
