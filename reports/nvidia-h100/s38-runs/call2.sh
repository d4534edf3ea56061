#!/usr/bin/env bash
# Session 38 call 2: interleaved against the session-37 kernel (dslab-base): dslab-l2a (the seesaw kernel's block and Q
# copies evict_first, again), dslab-split (the split-KV plan without whole requests: every SM takes keys, the CTAs'
# request boundaries staggered, requests merged); 16 heads batch 128 (also planned whole today) for base and split;
# then dslab-diag (base + clocks around the segment switch, in slots the kernel does not use) at 128 heads batch 128.
set -u
T0=$(date +%s)
dslab-base calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis batch=128 --axis kv_len=4096,8192,16384 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab-base dslab-l2a dslab-split" bash .device/ab.sh h128 3 $A --axis heads=128 > $OUT/ab128.log 2>&1
AB_LIMIT=100 BINS="dslab-base dslab-split" bash .device/ab.sh h16 2 $A --axis heads=16 > $OUT/ab16.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
for r in 1 2; do timeout 60 dslab-diag run $A --axis heads=128 --machine $OUT/machine.json --out $OUT/diag-$r > $OUT/diag-$r.log 2>&1; echo "diag exit $?"; done
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
