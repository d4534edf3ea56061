#!/usr/bin/env bash
# Set up, build, and run the tests (CPU tests here; GPU tests skip without a GPU).
# Usage: scripts/test.sh [ctest args...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$BUILD_DIR"
ctest --output-on-failure -j "$(nproc)" "$@"
