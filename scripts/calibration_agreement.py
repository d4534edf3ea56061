#!/usr/bin/env python3
"""Do two calibrations of one machine agree? Prints every ceiling both machine files have (cpu.*, gpu.*: the
numbers roofline_fraction and the planner divide by), their ratio, and exits 1 if any differs by more than the
tolerance (default 5%), 2 on bad input.

usage: scripts/calibration_agreement.py FIRST.json SECOND.json [--tolerance 0.05]
"""
import argparse
import json
import sys


def ceilings(path):
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--tolerance", type=float, default=0.05, help="largest relative difference allowed (default 0.05)")
    a = p.parse_args()
    m1, c1 = ceilings(a.first)
    m2, c2 = ceilings(a.second)
    if m1.get("cpu_model") != m2.get("cpu_model"):
        print(f"{a.second}: cpu_model '{m2.get('cpu_model')}' is not {a.first}'s '{m1.get('cpu_model')}': not one machine", file=sys.stderr)
        sys.exit(2)
    shared = [k for k in c1 if k in c2]
    if not shared:
        print(f"{a.second}: no ceiling in common with {a.first}", file=sys.stderr)
        sys.exit(2)
    worst = 0.0
    print(f"{'ceiling':38} {'first':>12} {'second':>12} {'second/first':>12}")
    for k in shared:
        ratio = c2[k] / c1[k] if c1[k] else float("inf")
        diff = abs(c2[k] - c1[k]) / max(abs(c1[k]), abs(c2[k]), 1e-300)
        worst = max(worst, diff)
        flag = "  <-- differs" if diff > a.tolerance else ""
        print(f"{k:38} {c1[k]:12.4g} {c2[k]:12.4g} {ratio:12.3f}{flag}")
    verdict = "agree" if worst <= a.tolerance else "DISAGREE"
    print(f"{len(shared)} ceilings; largest difference {100 * worst:.1f}% (tolerance {100 * a.tolerance:.0f}%): {verdict}")
    sys.exit(0 if worst <= a.tolerance else 1)


if __name__ == "__main__":
    main()
