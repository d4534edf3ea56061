#!/usr/bin/env bash
# Session 38 call 4: which copies get the L2 evict_first hint, interleaved against the session-37 kernel (dslab-base):
# dslab-l2a (every block and Q copy), dslab-l2q (Q's copies only), dslab-l2t1 (Q's, and the blocks' in the second
# row tile's CTAs only - the first reader of a block shared by the two row tiles keeps it normal), dslab-l2f (Q's, and
# half of the blocks' copies by createpolicy's fraction).
set -u
T0=$(date +%s)
dslab-base calibrate --out $OUT/machine.json > $OUT/cal.log 2>&1
A="--model deepseek-v3 --axis page_size=64 --timeout 0.3 --axis kv_len=4096,8192,16384 --axis heads=128 --axis batch=128 --variant mla/fused/cuda"
AB_LIMIT=100 BINS="dslab-base dslab-l2a dslab-l2q dslab-l2t1 dslab-l2f" bash .device/ab.sh h128 3 $A > $OUT/ab128.log 2>&1
grep -h exit $OUT/ab*.log | sort | uniq -c
echo "t=$(( $(date +%s) - T0 ))"
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
