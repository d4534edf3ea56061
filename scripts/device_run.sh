#!/usr/bin/env bash
# Steps on a GPU machine, from the project root after `source .device/env.sh` (the bundle: scripts/device_bundle.sh):
# machine facts, calibration, the test binaries (GPU tests, compute-sanitizer), committed results by topic, a kernel
# A/B and Nsight Compute. Logs and results go under OUT (default results/device).
# Usage: scripts/device_run.sh [STEP...]
#   steps: facts calibrate calibrate-twice tests gpu-tests sanitize[:POINT,...]
#          reproduce:TOPIC[,TOPIC...] (scripts/reproduce.sh; the reports/ it wrote into OUT/reports.tgz)
#          ncu:KERNEL_REGEX:RUN,ARGS (Nsight Compute's main sections for the matching kernels of one `dslab run` point)
#          ab:TAG:ROUNDS (BINS, interleaved, on AB_ARGS's points: scripts/kernel_variant.sh, scripts/ab_table.py)
#          pack (all but run.log into OUT/out.tar.xz; a later pack adds to it)
#   (default: facts gpu-tests). GPU_TESTS_FILTER narrows gpu-tests (a gtest filter, default Gpu*); CALIBRATE_REPEAT:
#   runs per calibration (calibrate: 1, calibrate-twice: 3).
set -uo pipefail
OUT=${OUT:-results/device}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(facts gpu-tests)
log="$OUT/run.log"
machine="$OUT/machine.json"
step() { printf '\n=== %s (%s)\n' "$1" "$(date +%T)" | tee -a "$log"; }
for s in "${steps[@]}"; do
  case $s in
    facts)
      step facts
      { nvidia-smi -L; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total,driver_version --format=csv
        lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|L3|Flags' | cut -c1-300; echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1)"; dslab list; } >>"$log" 2>&1 ;;
    calibrate)
      step calibrate
      # (one run by default: the GPU's ceilings moved 2-7% between single calibrations of one host; for CPU sweeps set
      # CALIBRATE_REPEAT=3, as its ceilings moved up to 49%, lowest right after the host started)
      timeout $((120 * ${CALIBRATE_REPEAT:-1})) dslab calibrate --repeat "${CALIBRATE_REPEAT:-1}" --out "$machine" >>"$log" 2>&1 ||
        echo "calibrate failed: $?" | tee -a "$log" ;;
    calibrate-twice)
      # Two calibrations of this machine (each the best of 3), then whether they agree within 5% on every ceiling.
      step calibrate-twice
      timeout 240 dslab calibrate --repeat "${CALIBRATE_REPEAT:-3}" --out "$machine" >>"$log" 2>&1 || echo "calibrate failed: $?" | tee -a "$log"
      timeout 240 dslab calibrate --repeat "${CALIBRATE_REPEAT:-3}" --out "$OUT/machine-2.json" >>"$log" 2>&1 || echo "calibrate failed: $?" | tee -a "$log"
      python3 scripts/calibration_agreement.py "$machine" "$OUT/machine-2.json" 2>&1 | tee -a "$log" ;;
    tests)
      step tests
      DSLAB_BINARY=$(command -v dslab) timeout 240 dslab_tests --gtest_brief=1 --gtest_filter='-Gpu*' >"$OUT/tests.log" 2>&1
      echo "dslab_tests exit $?" | tee -a "$log"; tail -3 "$OUT/tests.log" | tee -a "$log" ;;
    gpu-tests)
      step gpu-tests
      DSLAB_BINARY=$(command -v dslab) timeout "${GPU_TESTS_LIMIT:-540}" dslab_tests --gtest_filter="${GPU_TESTS_FILTER:-Gpu*}" >"$OUT/gpu-tests.log" 2>&1
      echo "dslab_tests (GPU) exit $?" | tee -a "$log"; grep -E '^\[  (FAILED|PASSED|SKIPPED)' "$OUT/gpu-tests.log" | tail -12 | tee -a "$log" ;;
    sanitize|sanitize:*)
      # compute-sanitizer memcheck + racecheck over small points of every GPU op (scripts/sanitize.sh; sanitize:a,b
      # runs only those TOOL-POINT names, e.g. sanitize:memcheck-layer-tiny,racecheck-moe-grouped).
      points=${s#sanitize}; points=${points#:}
      step "sanitize ${points:-all}"
      # shellcheck disable=SC2086  # the names, word-split on purpose
      timeout "${SANITIZE_LIMIT:-540}" scripts/sanitize.sh "$OUT/sanitize" ${points//,/ } 2>&1 | tee -a "$log" | tail -40 >"$OUT/sanitize.txt"
      echo "sanitize exit ${PIPESTATUS[0]}" | tee -a "$log" ;;
    ab:*)
      # An interleaved A/B of dslab binaries (scripts/kernel_variant.sh builds experiment ones): ab:TAG:ROUNDS runs
      # each binary in BINS (default "dslab dslab-base") on the points AB_ARGS gives (dslab run options), round after
      # round, into $OUT/ab/TAG-BINARY-ROUND/results.json (each run capped at AB_LIMIT s, default 300);
      # scripts/ab_table.py $OUT/ab tabulates them. Interleaving puts a host's drift on every binary alike.
      spec=${s#ab:}; tag=${spec%%:*}; rounds=${spec#*:}
      [[ $rounds =~ ^[1-9][0-9]*$ && $spec == *:* && -n $tag ]] || { echo "device_run.sh: step '$s': expected ab:TAG:ROUNDS (ROUNDS a positive count)" >&2; exit 2; }
      step "ab $tag x$rounds: ${BINS:-dslab dslab-base}"
      mkdir -p "$OUT/ab"
      for r in $(seq 1 "$rounds"); do
        for b in ${BINS:-dslab dslab-base}; do
          # shellcheck disable=SC2086  # AB_ARGS: dslab run options, word-split on purpose
          timeout "${AB_LIMIT:-300}" "$b" run ${AB_ARGS:-} --machine "$machine" --out "$OUT/ab/$tag-$b-$r" >"$OUT/ab/$tag-$b-$r.log" 2>&1
          echo "$tag $b round $r: exit $?" | tee -a "$log"
        done
      done ;;
    reproduce:*)
      # Topics of committed results (scripts/reproduce.sh, workloads/topics.json) on this machine: reproduce:a,b.
      topics=${s#reproduce:}
      step "reproduce $topics"
      # shellcheck disable=SC2086  # the topics, word-split on purpose
      timeout "${SWEEP_LIMIT:-570}" scripts/reproduce.sh ${topics//,/ } 2>&1 | tee -a "$log" | tail -20
      tar -czf "$OUT/reports.tgz" reports 2>/dev/null ;;
    pack)
      # Everything under $OUT but run.log into out.tar.xz (a call brings back at most 8 files): put it last, or after
      # any step whose files must survive a later step running out of time; a later pack adds to the same archive.
      # The calibration (machine*.json) stays too: later sweeps compute their roofline fractions from it.
      step pack
      (cd "$OUT" && find . -type f ! -name run.log ! -name out.tar.xz ! -name out.tar ! -name .pack-list | sort >.pack-list &&
        { [ ! -f out.tar.xz ] || xz -d out.tar.xz; } && tar -rf out.tar -T .pack-list && xz -T0 out.tar &&
        grep -v -E '^\./machine(-[0-9]+)?\.json$' .pack-list | xargs -d '\n' rm -f && rm -f .pack-list && find . -mindepth 1 -type d -empty -delete)
      echo "packed: $(tar -tJf "$OUT/out.tar.xz" | wc -l) files in out.tar.xz" | tee -a "$log" ;;
    ncu:*)
      # Nsight Compute on one point: ncu:KERNEL_REGEX:DSLAB_RUN_ARGS (the run's arguments, commas for spaces), e.g.
      # ncu:scores_kernel:--model,deepseek-v3,--variant,sparse/dsa/cuda,--axis,batch=16. Each matching kernel's first
      # NCU_LAUNCHES (default 2) launches after NCU_SKIP (2: past the warm-up) with the speed-of-light, memory, warp
      # state, occupancy and launch sections (NCU_SECTIONS adds more, e.g. "SchedulerStats SourceCounters": where the
      # warps stall, by instruction), clocks left alone (METHOD.md), into $OUT/ncu-KERNEL_REGEX.txt.
      spec=${s#ncu:}; kernel=${spec%%:*}; run_args=${spec#*:}
      step "ncu $kernel"
      name=$(printf '%s' "$kernel" | tr -c 'A-Za-z0-9_.-' '_')
      extra=()
      for x in ${NCU_SECTIONS:-}; do extra+=(--section "$x"); done
      # shellcheck disable=SC2086  # the run's arguments, word-split on purpose
      timeout "${NCU_LIMIT:-240}" ncu --clock-control none -k "regex:$kernel" --launch-skip "${NCU_SKIP:-2}" --launch-count "${NCU_LAUNCHES:-2}" \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats "${extra[@]}" \
        dslab run ${run_args//,/ } --no-verify --min-samples 1 --min-time 0 --timeout 0.2 --out "$OUT/ncu-run" >"$OUT/ncu-$name.txt" 2>&1
      echo "ncu exit $?" | tee -a "$log"
      grep -E '^  [A-Za-z_(].*\(|Duration|DRAM Throughput|Compute \(SM\)|Warp Cycles Per Issued|Achieved Active Warps' "$OUT/ncu-$name.txt" | tee -a "$log"
      rm -rf "$OUT/ncu-run" ;;
    *) echo "unknown step '$s' (expected facts calibrate calibrate-twice tests gpu-tests sanitize[:POINTS] reproduce:TOPICS ab:TAG:ROUNDS ncu:KERNEL:ARGS pack)" >&2; exit 2 ;;
  esac
done
grep -E '^(mla|moe|layer|variant|results)' "$log" | tail -70
exit 0  # (each step's own status is in the log: the grep above finds nothing after steps that print no results)
