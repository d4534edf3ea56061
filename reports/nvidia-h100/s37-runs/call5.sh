#!/usr/bin/env bash
# Session 37 call 5: the final tree (dslab: lazy max, outputs through stage 1 and tensor stores, switch phases) against
# dslab-base (71cffaf) and dslab-pf (the next segment's first blocks and Q prefetched into L2 two pairs before its
# copies, instead of Q at the segment's start), interleaved; FlashInfer beside; the final tree's MLA GPU tests and
# memcheck of the fused kernel at 96 and 128 heads.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    keep=('first_segment_last_pairs','first_segment_tail_pair','first_segment_last_pair','first_segment_accumulated','first_segment_summed','first_segment_stored','second_segment_q_landed','second_segment_scored','second_segment_first_accumulated','last_segment_last_pairs','last_block_accumulated')
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} step {r['real_time']:.1f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --axis batch=128,64 --axis kv_len=4096,8192,16384"
AB_LIMIT=200 BINS="dslab dslab-pf dslab-base" bash .device/ab.sh f 2 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
AB_LIMIT=200 BINS="dslab" bash .device/ab.sh fi 1 $A --variant mla/flashinfer/cuda > $OUT/ab-fi.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
echo "t=$(( $(date +%s) - T0 ))"
SANITIZE_LIMIT=100 scripts/device_run.sh sanitize:memcheck-mla-fused-v3 > /dev/null 2>&1
tail -2 $OUT/sanitize.txt
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
