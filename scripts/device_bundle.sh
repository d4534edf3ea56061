#!/usr/bin/env bash
# This project's device bundle: ../shared/device/bundle.sh BUILD_DIR with the test binary, then the executables and
# the larger libraries xz-compressed (what travels to the device is capped at 64 MiB); env.sh, sourced first on the
# device, unpacks them and sets DSLAB_PREBUILT, so scripts/run.sh and scripts/reproduce.sh use the bundle there. Usage: scripts/device_bundle.sh [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
cd "$root"
rm -rf .device
../shared/device/bundle.sh "$build" "$build/tests/dslab_tests" >/dev/null
# KTransformers' AMX build and its libraries (the CPU MoE peers; the device has no package registry).
kt=${DSLAB_KT_KERNEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dslab/kt-kernel-0.7.2}
if ls "$kt"/kt_kernel/_kt_kernel_ext_amx.* >/dev/null 2>&1; then
  mkdir -p .device/kt-kernel/kt_kernel
  cp "$kt"/kt_kernel/_kt_kernel_ext_amx.* .device/kt-kernel/kt_kernel/ && cp -r "$kt/kt_kernel.libs" .device/kt-kernel/
  find .device/kt-kernel -type f -exec xz -T0 -9 {} +
fi
xz -T0 -9 .device/bin/*
find .device/lib -type f -size +1M ! -name '*.xz' -exec xz -T0 -9 {} +
{ echo 'for f in .device/bin/*.xz .device/lib/*.xz .device/kt-kernel/*/*.xz; do [ -e "$f" ] && [ ! -e "${f%.xz}" ] && xz -d -k "$f"; done'
  echo '[ -d .device/kt-kernel ] && export DSLAB_KT_KERNEL_DIR="$PWD/.device/kt-kernel"'
  cat .device/env.sh
  echo 'export DSLAB_PREBUILT="$PWD/.device/bin"'; } >.device/env.sh.new
mv .device/env.sh.new .device/env.sh
echo "bundled into .device ($(du -sh .device | cut -f1)); the tree that travels: $(( ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -sb .device | cut -f1)) >> 20 )) MiB of 64"
