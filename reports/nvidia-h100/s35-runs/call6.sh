#!/usr/bin/env bash
# Session 35 call 6: the two-warpgroup kernel with the block it copies a pair (a1: half a pair) from now prefetched
# into L2 tile by tile (cp.async.bulk.prefetch.tensor, row tile 0's CTA), against the kernel without (dslab).
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','first_block_accumulated','first_segment_accumulated','second_segment_first_accumulated','done','last_done')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    nm='/'.join(x for x in r['name'].split('/')[1:] if x.split(':')[0] in ('heads','batch','kv_len'))
    print(sys.argv[1].split('/')[-2], nm, f"step {r['real_time']:.1f} kernel {c.get('kernel_s',0)*1e6:.1f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')}", ph)
PY
done; }
AB_LIMIT=120 BINS="dslab dslab-a1 dslab-a2" bash .device/ab.sh l2 2 --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=64,128 --axis kv_len=4096,8192 --axis page_size=64 --timeout 0.3 > $OUT/ab-l2.log 2>&1
grep -h "exit" $OUT/ab-l2.log | sort | uniq -c
P $OUT/ab/l2-*/results.json
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
