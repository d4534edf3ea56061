#!/usr/bin/env python3
"""Do two calibrations of one machine agree? Prints every number both machine files have (cpu.*, gpu.*) with their
ratio. The ceilings - rates no kernel beats (*_bytes_per_s, *_flops, *_ops: what roofline_fraction and the planner
divide by) - must agree within the tolerance (default 5%): exit 1 if one does not. The latency costs (*_s: a launch,
a 4 KB copy, a host round trip, a graph node; the planner's per-op overheads) are host-noise-bound, a few
microseconds each: they are printed with their difference and checked against their own, looser tolerance
(--cost-tolerance, default: not checked). Exit 2 on bad input.

usage: scripts/calibration_agreement.py FIRST.json SECOND.json [--tolerance 0.05] [--cost-tolerance F]
"""
import argparse
import json
import sys

CEILING_SUFFIXES = ("_bytes_per_s", "_flops", "_ops")


def numbers(path):
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: cannot read a machine file ({e})", file=sys.stderr)
        sys.exit(2)
    if not isinstance(m, dict) or not any(isinstance(m.get(s), dict) for s in ("cpu", "gpu")):
        print(f"{path}: not a machine file (expected 'cpu' or 'gpu' sections, from dslab calibrate)", file=sys.stderr)
        sys.exit(2)
    out = {}
    for section in ("cpu", "gpu"):
        for key, value in (m.get(section) or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "threads":
                out[f"{section}.{key}"] = float(value)
    return m, out


def kind(name):
    if name.endswith(CEILING_SUFFIXES):
        return "ceiling"
    if name.endswith("_s"):
        return "cost"
    return "size"  # memory_bytes and the like: must match exactly on one machine


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--tolerance", type=float, default=0.05, help="largest relative difference of a ceiling (default 0.05)")
    p.add_argument("--cost-tolerance", type=float, default=None,
                   help="largest relative difference of a latency cost (default: printed, not checked)")
    a = p.parse_args()
    m1, c1 = numbers(a.first)
    m2, c2 = numbers(a.second)
    if m1.get("cpu_model") != m2.get("cpu_model"):
        print(f"{a.second}: cpu_model '{m2.get('cpu_model')}' is not {a.first}'s '{m1.get('cpu_model')}': not one machine", file=sys.stderr)
        sys.exit(2)
    shared = [k for k in c1 if k in c2]
    if not any(kind(k) == "ceiling" for k in shared):
        print(f"{a.second}: no ceiling in common with {a.first}", file=sys.stderr)
        sys.exit(2)
    limits = {"ceiling": a.tolerance, "cost": a.cost_tolerance, "size": 0.0}
    worst = {"ceiling": 0.0, "cost": 0.0, "size": 0.0}
    failed = False
    print(f"{'number':38} {'kind':8} {'first':>12} {'second':>12} {'second/first':>12}")
    for k in sorted(shared, key=lambda k: (kind(k) != "ceiling", k)):
        ratio = c2[k] / c1[k] if c1[k] else float("inf")
        diff = abs(c2[k] - c1[k]) / max(abs(c1[k]), abs(c2[k]), 1e-300)
        worst[kind(k)] = max(worst[kind(k)], diff)
        limit = limits[kind(k)]
        flag = ""
        if limit is not None and diff > limit:
            flag, failed = "  <-- differs", True
        print(f"{k:38} {kind(k):8} {c1[k]:12.4g} {c2[k]:12.4g} {ratio:12.3f}{flag}")
    for path, m in ((a.first, m1), (a.second, m2)):  # (dslab calibrate: what else the host did meanwhile)
        h = m.get("host_activity")
        if isinstance(h, dict):
            print(f"{path}: other work {100 * h.get('others_cpu_fraction', 0):.0f}% of the CPUs, steal "
                  f"{100 * h.get('steal_fraction', 0):.0f}%, load average {h.get('load_average_1m', 0):.1f}")
    n_ceilings = sum(kind(k) == "ceiling" for k in shared)
    n_costs = sum(kind(k) == "cost" for k in shared)
    ceilings_ok = worst["ceiling"] <= a.tolerance
    print(f"{n_ceilings} ceilings; largest difference {100 * worst['ceiling']:.1f}% (tolerance {100 * a.tolerance:.0f}%): "
          f"{'agree' if ceilings_ok else 'DISAGREE'}")
    checked = f"tolerance {100 * a.cost_tolerance:.0f}%" if a.cost_tolerance is not None else "not checked"
    print(f"{n_costs} latency costs; largest difference {100 * worst['cost']:.1f}% ({checked})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
