#!/usr/bin/env bash
# scripts/plot.py's reading of results: a run's repetitions become one entry (the median of their medians), while one
# point measured in two suites stays two runs, each drawn in its own suite's charts.
# A peer that takes fewer axes meets the variant it is compared with at the axes they share.
set -uo pipefail
python=$1 script=$2
"$python" -c 'import matplotlib' 2>/dev/null || { echo "no matplotlib in $python: skipped"; exit 77; }
"$python" - "$script" <<'PY'
import importlib.util, sys
spec = importlib.util.spec_from_file_location("plot", sys.argv[1])
plot = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot)
def entry(suite, name, t, rep=0):
    return {"suite": suite, "name": name, "variant": name.split("/p")[0], "axes": {}, "real_time": t,
            "repetition_index": rep}
runs = plot.one_entry_per_run([entry("a", "v/p1", 1.0, 0), entry("a", "v/p1", 3.0, 1), entry("a", "v/p1", 2.0, 2),
                               entry("b", "v/p1", 10.0), {"name": "v/p1_median", "run_type": "aggregate"}])
got = sorted((b["suite"], b["real_time"]) for b in runs)
assert got == [("a", 2.0), ("b", 10.0)], got
print("ok: repetitions merged within a suite, the same point in another suite kept apart")
# A peer that takes only the shape meets the variant with launch options at the axes they share; two runs of the
# variant at one shared point (eager and graph) keep all axes apart.
ours = {"variant": "layer", "axes": {"batch": 1, "executor": "graph"}}
peer = {"variant": "peer", "axes": {"batch": 1}}
assert plot.shared_axes([ours, peer]) == {"batch"}, plot.shared_axes([ours, peer])
eager = {"variant": "layer", "axes": {"batch": 1, "executor": "eager"}}
assert plot.shared_axes([ours, eager, peer]) is None
assert plot.shared_axes([ours, dict(ours, variant="other")]) is None  # the same axes: nothing to line up
print("ok: peers with fewer axes meet the variant at the axes they share")
PY
