#!/usr/bin/env bash
# Session 38 call 1: L2 eviction priorities around the segment switch, interleaved against the session-37 kernel (dslab-base):
# dslab-l2a (the seesaw kernel's block and Q copies evict_first), dslab-l2b (l2a + the next segment's first two blocks
# prefetched into L2 at the segment's start, beside its Q), dslab-nextq (s37 prepared-next-q-after-hand-over.diff),
# dslab-clear (s37 prepared-split-clear.diff);
# then the MLA GPU tests of dslab-l2b (which also has the part-filled tile's copy-out through swz).
set -u
T0=$(date +%s)
dslab-base calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    keep=('first_block_accumulated','first_segment_last_pairs','first_segment_last_pair','first_segment_accumulated','first_segment_stored','second_segment_q_landed','second_segment_first_accumulated','last_segment_last_pairs','last_block_accumulated','done','last_done')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    print(sys.argv[1].split('/')[-2], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} step {r['real_time']:.1f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --axis batch=128,64 --axis kv_len=4096,8192,16384"
AB_LIMIT=100 BINS="dslab-base dslab-l2a dslab-l2b dslab-nextq dslab-clear" bash .device/ab.sh x 2 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
for n in l2b; do
  DSLAB_BINARY=$(command -v dslab-$n) timeout 110 dslab_tests-$n --gtest_filter='*GpuMla*' > $OUT/gpu-tests-$n.log 2>&1
  echo "tests $n exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-$n.log | head
  echo "t=$(( $(date +%s) - T0 ))"
done
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
