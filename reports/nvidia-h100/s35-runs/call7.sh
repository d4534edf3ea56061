#!/usr/bin/env bash
# Session 35 call 7: every GPU test (Gpu*) at the session's final device code.
set -u
GPU_TESTS_LIMIT=520 scripts/device_run.sh gpu-tests > /dev/null 2>&1
grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]|tests from .* ran" $OUT/gpu-tests.log | head -30
grep -B2 -A3 "Failure" $OUT/gpu-tests.log | head -30
tail -3 $OUT/run.log
xz -9 $OUT/gpu-tests.log
