#!/usr/bin/env bash
# Reproduces committed results: runs each topic's sweep (workloads/topics.json) with this build, writes its report
# and plots, and - from a clean build only - replaces reports/<device>/<topic>/ and the device's index
# (reports/<device>/README.md). A dirty build's results stay under results/reproduce/ (they record a hash of the
# diff) and are never written into reports/.
# Usage: scripts/reproduce.sh [--device NAME] [--list] TOPIC... | all
#   --device NAME   the reports/ folder (default: the GPU's name, e.g. nvidia-h200; without a GPU the CPU's, e.g. amd-epyc)
#   --list          the topics and what each runs
# Environment: DSLAB (the dslab binary; default build/dslab, else dslab on PATH), CALIBRATE_REPEAT (default 3),
#   RUN_ARGS (more dslab run options, e.g. "--timeout 1"), DSLAB_CHECKPOINTS (where a topic's random checkpoint is
#   written once; default ~/.cache/dslab/checkpoints), DSLAB_PYTHON (the Python with torch that writes it).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { printf '[reproduce] %s\n' "$*" >&2; }
bad() { printf 'reproduce: %s\n' "$*" >&2; exit 2; }
dslab=${DSLAB:-}
[ -n "$dslab" ] || [ -z "${DSLAB_PREBUILT:-}" ] || dslab=$DSLAB_PREBUILT/dslab
[ -n "$dslab" ] || { [ -x build/dslab ] && dslab=build/dslab; } || dslab=$(command -v dslab || true)
[ -n "$dslab" ] && [ -x "$dslab" ] || bad "no dslab binary (build it: scripts/test.sh, or set DSLAB)"
python=python3
[ -x .venv/bin/python ] && [ -z "${DSLAB_PREBUILT:-}" ] && python=.venv/bin/python
device="" topics=()
while [ $# -gt 0 ]; do
  case $1 in
    --device) [ $# -ge 2 ] || bad "--device: expected a name"; device=$2; shift 2 ;;
    --device=*) device=${1#--device=}; shift ;;
    --list) "$python" scripts/reports_index.py --list; exit 0 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) bad "unknown option '$1' (see --help)" ;;
    *) topics+=("$1"); shift ;;
  esac
done
[ ${#topics[@]} -gt 0 ] || bad "no topic given: expected one or more of $("$python" scripts/reports_index.py --names) or all"
if [ "${topics[0]}" = all ]; then read -r -a topics <<<"$("$python" scripts/reports_index.py --names)"; fi
known=" $("$python" scripts/reports_index.py --names) "
for t in "${topics[@]}"; do [[ "$known" == *" $t "* ]] || bad "topic '$t': expected one of${known% } or all"; done
[[ "$device" =~ ^[a-z0-9][a-z0-9.-]*$ ]] || [ -z "$device" ] || bad "--device '$device': expected lower-case letters, digits, '.', '-'"

has_gpu=0
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
[ -n "$gpu_name" ] && has_gpu=1
slug() { tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g'; }
if [ -z "$device" ]; then
  if [ $has_gpu = 1 ]; then device=$(echo "$gpu_name" | awk '{print $1, $2}' | slug)
  else device=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | awk '{print $1, $2}' | slug); fi
fi
version=$("$dslab" --version)  # "dslab 0.1.0 (<sha>[-dirty])"
sha=$(echo "$version" | sed -E 's/.*\((.*)\).*/\1/')
clean=1
case $sha in *-dirty|unknown|"") clean=0 ;; esac
[ $clean = 1 ] || say "this build ($sha) is not a clean commit: results stay under results/reproduce/, reports/ is not touched"
scratch=results/reproduce/$device
mkdir -p "$scratch"
machine=reports/$device/calibration/machine.json
[ -f "$machine" ] || machine=${DSLAB_MACHINE:-$HOME/.cache/dslab/machine.json}

publish() {  # publish TOPIC FILE...: those files and the plots of the topic's scratch set into reports/<device>/<topic>/
  local topic=$1 dest=reports/$device/$1
  shift
  [ $clean = 1 ] || return 0
  rm -rf "$dest.partial" && mkdir -p "$dest.partial"
  for f in "$@"; do cp "$scratch/$topic/$f" "$dest.partial/"; done
  if ls "$scratch/$topic/plots/"*.png >/dev/null 2>&1; then mkdir -p "$dest.partial/plots"; cp "$scratch/$topic/plots/"*.png "$dest.partial/plots/"; fi
  rm -rf "$dest" && mv "$dest.partial" "$dest"
  say "$topic: written to $dest"
}

status=0
for topic in "${topics[@]}"; do
  spec=$("$python" scripts/reports_index.py --spec "$topic")  # "calibrate" | "SWEEP GPU SUITE..."
  read -r -a words <<<"$spec"
  out=$scratch/$topic
  rm -rf "$out" && mkdir -p "$out"
  started=$(date +%s)
  if [ "${words[0]}" = calibrate ]; then
    say "$topic: dslab calibrate --repeat ${CALIBRATE_REPEAT:-3}"
    "$dslab" calibrate --repeat "${CALIBRATE_REPEAT:-3}" --out "$out/machine.json" >"$out/calibrate.log" 2>&1 ||
      { say "$topic: calibrate failed (see $out/calibrate.log)"; status=1; continue; }
    publish "$topic" machine.json
    [ $clean = 1 ] && machine=reports/$device/calibration/machine.json || machine=$out/machine.json
  elif [ "${words[0]}" = generate ]; then
    if [ "${words[1]}" = 1 ] && [ $has_gpu = 0 ]; then say "$topic: needs a GPU, none here: skipped"; continue; fi
    say "$topic: dslab generate ${words[*]:2}"
    rc=0
    "$dslab" generate "${words[@]:2}" --out "$out" || rc=$?
    if [ ! -f "$out/results.json" ]; then say "$topic: no results (dslab generate exit $rc)"; status=1; continue; fi
    "$python" scripts/plot.py "$out/results.json" --out "$out/plots" >/dev/null 2>&1 || say "$topic: plots failed (matplotlib?)"
    if [ $rc != 0 ]; then say "$topic: dslab generate exit $rc (tokens differ from one-at-a-time?): not published"; status=1; continue; fi
    publish "$topic" results.json report.md
  else
    sweep=${words[0]} needs_gpu=${words[1]}
    if [ "$needs_gpu" = 1 ] && [ $has_gpu = 0 ]; then say "$topic: needs a GPU, none here: skipped"; continue; fi
    suite_args=()
    for s in "${words[@]:2}"; do suite_args+=(--suite "$s"); done
    config=$("$python" scripts/reports_index.py --checkpoint "$topic")
    if [ -n "$config" ]; then  # a topic on real weights (peers that run a checkpoint): a random one of full size
      ckpt=${DSLAB_CHECKPOINTS:-$HOME/.cache/dslab/checkpoints}/$(basename "$config" .json)-random
      if [ ! -f "$ckpt/config.json" ]; then
        say "$topic: writing a random checkpoint of $config to $ckpt (once)"
        rm -rf "$ckpt.partial" && mkdir -p "$ckpt.partial"
        "${DSLAB_PYTHON:-$python}" scripts/make_checkpoint.py --config "$config" --out "$ckpt.partial" --steps 1 \
          --device "$([ $has_gpu = 1 ] && echo cuda || echo cpu)" >"$out/checkpoint.log" 2>&1 ||
          { say "$topic: make_checkpoint.py failed (see $out/checkpoint.log)"; status=1; continue; }
        rm -rf "$ckpt" && mv "$ckpt.partial" "$ckpt"
      fi
      suite_args+=(--weights "$ckpt")
    fi
    machine_args=()
    [ -f "$machine" ] && machine_args=(--machine "$machine")
    say "$topic: dslab run $sweep ${suite_args[*]}"
    rc=0
    # shellcheck disable=SC2086  # RUN_ARGS: options, word-split on purpose
    "$dslab" run "$sweep" "${suite_args[@]}" "${machine_args[@]}" --out "$out" ${RUN_ARGS:-} || rc=$?
    if [ ! -f "$out/results.json" ]; then say "$topic: no results (dslab run exit $rc)"; status=1; continue; fi
    "$dslab" report "$out/results.json" --out "$out" >/dev/null
    "$python" scripts/plot.py "$out/results.json" --out "$out/plots" >/dev/null 2>&1 || say "$topic: plots failed (matplotlib?)"
    if [ $rc != 0 ]; then say "$topic: dslab run exit $rc (a failed verification?): not published"; status=1; continue; fi
    publish "$topic" results.json report.md
  fi
  say "$topic: $(( $(date +%s) - started )) s"
done
if [ $clean = 1 ] && [ -d "reports/$device" ]; then
  "$python" scripts/reports_index.py --index "reports/$device" && say "index: reports/$device/README.md"
fi
[ $clean = 1 ] || exit 3
exit $status
