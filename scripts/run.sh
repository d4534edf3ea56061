#!/usr/bin/env bash
# Set up, build, calibrate this machine once (best of 3), run the default sweep (or the sweep given), then write the report
# (report.md) and the comparison plots (PNG + SVG) next to its results.json and say where they are.
# Usage: scripts/run.sh [SWEEP.json] [dslab run options...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$DSLAB_ROOT"
machine=${DSLAB_MACHINE:-$HOME/.cache/dslab/machine.json}
if [ ! -f "$machine" ]; then
  # (each ceiling the best of three runs: on a shared VM one run's DRAM rate moved 72%, and a ceiling read low puts
  # roofline fractions above 1; best-of-3 calibrations of the dev VM agreed within 1.2%)
  log "calibrating this machine's ceilings into $machine (best of 3 runs)"
  "$BUILD_DIR/dslab" calibrate --repeat 3 --out "$machine" >/dev/null
fi
sweep=workloads/sweeps/default.json
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then sweep=$1; shift; fi
out=results/$(basename "$sweep" .json)
# The results folder: the caller's --out, else results/<sweep name>.
out_args=(--out "$out")
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case ${args[i]} in
    --out) out=${args[i + 1]:-$out}; out_args=() ;;
    --out=*) out=${args[i]#--out=}; out_args=() ;;
  esac
done
case " $* " in *" --machine "*|*" --machine="*) machine_args=() ;; *) machine_args=(--machine "$machine") ;; esac
status=0
started=$(mktemp)
trap 'rm -f "$started"' EXIT
"$BUILD_DIR/dslab" run "$sweep" "${machine_args[@]}" "${out_args[@]}" "$@" || status=$?  # (a failed check still gets its report)
say() { printf '[dslab] %s\n' "$*" >&2; }
[ "$out/results.json" -nt "$started" ] || { say "the run wrote no $out/results.json: nothing to report"; exit $(( status ? status : 1 )); }
"$BUILD_DIR/dslab" report "$out/results.json" --out "$out" >/dev/null
"$VENV/bin/python" scripts/plot.py "$out/results.json" --out "$out/plots" >/dev/null
say "results: $out/results.json"
say "report:  $out/report.md"
say "plots:   $(cd "$out/plots" && ls *.png | tr '\n' ' ') in $out/plots"
exit $status
