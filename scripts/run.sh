#!/usr/bin/env bash
# Set up, build, calibrate this machine once, and run the default sweep (or the sweep given).
# Usage: scripts/run.sh [SWEEP.json] [dslab run options...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$DSLAB_ROOT"
machine=${DSLAB_MACHINE:-$HOME/.cache/dslab/machine.json}
if [ ! -f "$machine" ]; then
  log "calibrating this machine's ceilings into $machine"
  "$BUILD_DIR/dslab" calibrate --out "$machine" >/dev/null
fi
sweep=workloads/sweeps/default.json
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then sweep=$1; shift; fi
out=results/$(basename "$sweep" .json)
case " $* " in *" --out "*|*" --out="*) out_args=() ;; *) out_args=(--out "$out") ;; esac
case " $* " in *" --machine "*|*" --machine="*) machine_args=() ;; *) machine_args=(--machine "$machine") ;; esac
exec "$BUILD_DIR/dslab" run "$sweep" "${machine_args[@]}" "${out_args[@]}" "$@"
