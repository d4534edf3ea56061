#!/usr/bin/env bash
# Session 37 call 8: warpgroup 0 issuing block 2i + 2's first copies as soon as its own P V is done, before the hand-over barrier
# (dslab-early) rather than after it (dslab, the final tree), interleaved; dslab-early's MLA GPU tests.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    keep=('first_segment_last_pairs','first_segment_last_pair','first_segment_accumulated','first_segment_stored','second_segment_first_accumulated','last_block_accumulated','per_block')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} step {r['real_time']:.1f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --axis batch=128,64 --axis kv_len=4096,8192,16384"
AB_LIMIT=200 BINS="dslab-early dslab" bash .device/ab.sh e 2 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
DSLAB_BINARY=$(command -v dslab-early) timeout 100 dslab_tests-early --gtest_filter='*GpuMla*' > $OUT/gpu-tests-early.log 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-early.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
