#!/usr/bin/env bash
# Session 36 call 1: the stream (split) plan against whole requests at 128 heads, same binary (DSLAB_EXP_SPLIT=1), interleaved; FlashInfer beside.
set -u
T0=$(date +%s)
mkdir -p /tmp/xbin && printf '#!/bin/sh\nDSLAB_EXP_SPLIT=1 exec dslab "$@"\n' > /tmp/xbin/dslab-split && chmod +x /tmp/xbin/dslab-split
export PATH=/tmp/xbin:$PATH
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
timeout 90 dslab-split run --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=3 --axis q_len=1,2 --axis kv_len=700,5000 --axis page_size=64 --axis len_dist=mixed --axis executor=eager --axis kv_splits=auto,7 --timeout 0.1 --out $OUT/quick > $OUT/quick.log 2>&1
echo "quick rc $?"; grep -cE "verify PASS" $OUT/quick.log; grep -E "FAIL|rror" $OUT/quick.log | cut -c1-200 | head -5
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3"
AB_LIMIT=200 BINS="dslab dslab-split" bash .device/ab.sh b128 2 $A --variant mla/fused/cuda --axis batch=128 --axis kv_len=4096,8192,16384,32768 > $OUT/ab-b128.log 2>&1
AB_LIMIT=120 BINS="dslab dslab-split" bash .device/ab.sh b64 1 $A --variant mla/fused/cuda --axis batch=64 --axis kv_len=4096,8192 > $OUT/ab-b64.log 2>&1
AB_LIMIT=200 BINS="dslab" bash .device/ab.sh fi 1 $A --variant mla/flashinfer/cuda --axis batch=128,64 --axis kv_len=4096,8192,16384,32768 > $OUT/ab-fi.log 2>&1
grep -h "exit" $OUT/ab-*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
for f in $OUT/ab/*/results.json; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','first_block_accumulated','first_segment_accumulated','first_segment_written','second_segment_first_accumulated','last_block_accumulated','done','last_done')
    ph={k[16:]:round(v,1) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    a=r['axes']
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['batch'], a['kv_len'], f"step {r['real_time']:.1f} kernel {c.get('kernel_s',0)*1e6:.1f} dec {c.get('op_us.decode',0):.1f} comb {c.get('op_us.combine',0):.1f} seg {c.get('segments',0):.0f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}", ph)
PY
done
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
