#!/usr/bin/env bash
# Session 35 call 8 (4e20846): compute-sanitizer over the fused decode's other kernels at the final code.
set -u
SANITIZE_LIMIT=420 scripts/device_run.sh sanitize:racecheck-mla-fused-v3,racecheck-mla-fused-16h,memcheck-mla-fused-16h,memcheck-mla-merge-absorb > /dev/null 2>&1
tail -6 $OUT/sanitize.txt
for f in $OUT/sanitize/racecheck-*.log; do echo "== $f"; grep -oE "(Read|Write) access at [A-Za-z_0-9:<>]+" $f | awk '{print $4}' | sed 's/+0x.*//' | sort | uniq -c | sort -rn | head -5; grep -c "Race reported" $f; done
cd $OUT && tar cJf /tmp/out.tar.xz --exclude=run.log . ; mv /tmp/out.tar.xz $OUT/ && find . -mindepth 1 -maxdepth 1 ! -name out.tar.xz ! -name run.log -exec rm -rf {} +
