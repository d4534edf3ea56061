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
xz -T0 -9 .device/bin/*
find .device/lib -type f -size +1M ! -name '*.xz' -exec xz -T0 -9 {} +
{ echo 'for f in .device/bin/*.xz .device/lib/*.xz; do [ -e "$f" ] && [ ! -e "${f%.xz}" ] && xz -d -k "$f"; done'
  cat .device/env.sh
  echo 'export DSLAB_PREBUILT="$PWD/.device/bin"'; } >.device/env.sh.new
mv .device/env.sh.new .device/env.sh
echo "bundled into .device ($(du -sh .device | cut -f1)); the tree that travels: $(( ($(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) + $(du -sb .device | cut -f1)) >> 20 )) MiB of 64"
