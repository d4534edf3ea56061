#!/usr/bin/env bash
# Session 36 call 7: is the 128-head per-block rate a per-SM or a shared (L2 / HBM) limit? The same kernels with 128 / 64 / 32 busy CTAs (batch 64 auto, batch 32 and 16 with kv_splits = batch: one whole request a CTA).
set -u
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    keep=('per_block','first_block_accumulated','last_block_accumulated','done')
    ph={k[16:]:round(v,2) for k,v in c.items() if k.startswith('decode_phase_us.') and k[16:] in keep}
    a=r['axes']
    print(sys.argv[1].split('/')[-2], a['batch'], a['kv_len'], a['kv_splits'], f"kernel {c.get('kernel_s',0)*1e6:.1f} ctas {c.get('decode_phase.working_ctas',0):.0f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')}", ph)
PY
done; }
for b in dslab dslab-qreg; do
  for cfg in "64 auto" "32 32" "16 16"; do set -- $cfg
    timeout 100 $b run --model deepseek-v3 --variant mla/fused/cuda --axis heads=128 --axis batch=$1 --axis kv_splits=$2 --axis kv_len=8192 --axis page_size=64 --timeout 0.3 --machine $OUT/machine.json --out $OUT/p-$b-$1 > $OUT/p-$b-$1.log 2>&1
  done
done
P $OUT/p-*/results.json
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
