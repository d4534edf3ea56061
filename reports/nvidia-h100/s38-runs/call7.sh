#!/usr/bin/env bash
# Session 38 call 7: the fused variant's long-cache GPU test with its new case (128 heads, two requests on one CTA a
# row tile: the two-warpgroup kernel's instance without the L2 hint).
set -u
DSLAB_BINARY=$(command -v dslab) timeout 150 dslab_tests --gtest_filter='*GpuMla.LongSplitCacheMatchesReference/mla_fused_cuda' > $OUT/gpu-tests-long.log 2>&1
echo "tests exit $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" $OUT/gpu-tests-long.log | head
