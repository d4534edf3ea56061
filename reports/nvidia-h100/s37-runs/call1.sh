#!/usr/bin/env bash
# Session 37 call 1: the two-warpgroup kernel's lazy running max, A/B interleaved on one machine: dslab-base (71cffaf),
# dslab-lazy (lazy max), dslab-skip (+ block 2i's P re-fragmented only where block 2i + 1 moved the max), dslab (+
# warpgroup 1's softmax ahead of block 2i's max); FlashInfer beside; the MLA GPU tests of dslab and dslab-skip.
set -u
T0=$(date +%s)
dslab calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
P() { for f in "$@"; do python3 - "$f" <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
for r in d['benchmarks']:
    c=r.get('counters',{})
    a=r['axes']
    print(sys.argv[1].split('/')[-2], r.get('variant','')[4:8], a['heads'], a['batch'], a['kv_len'], f"kernel {c.get('kernel_s',0)*1e6:.1f} step {r['real_time']:.1f} ghz {c.get('decode_phase.sm_ghz',0):.2f} ver {r.get('verify_pass')} {r.get('verify_rel_err',0):.2e}")
PY
done; }
A="--model deepseek-v3 --axis heads=128 --axis page_size=64 --timeout 0.3 --axis batch=128,64 --axis kv_len=4096,8192,16384"
AB_LIMIT=200 BINS="dslab dslab-base dslab-lazy dslab-skip" bash .device/ab.sh e 3 $A --variant mla/fused/cuda > $OUT/ab.log 2>&1
AB_LIMIT=200 BINS="dslab" bash .device/ab.sh fi 1 $A --variant mla/flashinfer/cuda > $OUT/ab-fi.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
P $OUT/ab/*/results.json
echo "t=$(( $(date +%s) - T0 ))"
GPU_TESTS_FILTER='*GpuMla*' GPU_TESTS_LIMIT=150 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests.log | head
mv $OUT/gpu-tests.log $OUT/gpu-tests-spec.log
DSLAB_BINARY=$(command -v dslab-skip) timeout 150 dslab_tests-skip --gtest_filter='*GpuMla*' > $OUT/gpu-tests-skip.log 2>&1
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu-tests-skip.log | head
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
