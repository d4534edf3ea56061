#!/usr/bin/env python3
"""The table of an interleaved A/B: each point's time under each binary, round by round.

usage: scripts/ab_table.py AB_DIR [--counter NAME] [--base BINARY] [--phases KEY,...]

AB_DIR holds TAG-BINARY-ROUND/results.json (scripts/device_run.sh's ab step; BINARY is dslab or dslab-NAME, from
scripts/kernel_variant.sh). For every point (variant and axes) and binary: the counter per round in round order, its
median, and the ratio of the base binary's median to it (above 1: faster than the base). --counter: a result counter
(default kernel_s, the attention kernel's own time; a name ending in _s is shown in us); --base: the binary the others
are compared with (default dslab-base if present, else the first by name); --phases: decode_phase_us counters to show
the same way (e.g. first_segment_written,last_done). Exit 2, one line, where the folder holds no such results or a
point lacks the counter.
"""
import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys

RUN_DIR = re.compile(r'^(?P<tag>.+?)-(?P<binary>dslab(?:-[A-Za-z0-9_]+)?)-(?P<round>\d+)$')


def fail(message):
    print(f'ab_table.py: {message}', file=sys.stderr)
    sys.exit(2)


def point_name(bench):
    model = bench.get('model')
    variant = bench['name'].split('/' + model, 1)[0] if model else bench['name']
    axes = ' '.join(f'{k}={v}' for k, v in sorted(bench.get('axes', {}).items()))
    return ' '.join(x for x in (variant, model, axes) if x)


def read_runs(ab_dir):
    """{point: {binary: {round: counters}}} from every run folder with a results.json (aggregates skipped)."""
    runs = collections.defaultdict(lambda: collections.defaultdict(dict))
    found = 0
    for path in sorted(glob.glob(os.path.join(ab_dir, '*', 'results.json'))):
        m = RUN_DIR.match(os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        try:
            benchmarks = json.load(open(path))['benchmarks']
        except (OSError, ValueError, KeyError) as e:
            fail(f'{path}: not a dslab results file ({e})')
        found += 1
        for bench in benchmarks:
            if 'aggregate_name' in bench:
                continue
            runs[point_name(bench)][m['binary']][int(m['round'])] = bench.get('counters', {})
    if not found:
        fail(f'{ab_dir}: no TAG-BINARY-ROUND/results.json (expected the ab step of scripts/device_run.sh)')
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('ab_dir')
    parser.add_argument('--counter', default='kernel_s')
    parser.add_argument('--base')
    parser.add_argument('--phases', default='')
    args = parser.parse_args()
    runs = read_runs(args.ab_dir)
    binaries = sorted({b for by_binary in runs.values() for b in by_binary})
    base = args.base or ('dslab-base' if 'dslab-base' in binaries else binaries[0])
    if base not in binaries:
        fail(f'--base {base}: not among the binaries run ({", ".join(binaries)})')
    keys = [(args.counter, args.counter)] + [(f'decode_phase_us.{k}', k) for k in args.phases.split(',') if k]
    width = max(len(b) for b in binaries)
    for point in sorted(runs):
        print(point)
        for key, label in keys:
            scale = 1e6 if key.endswith('_s') else 1.0
            series = {}  # binary: its values, round by round
            for binary in binaries:
                rounds = runs[point].get(binary, {})
                values = [c[key] * scale for _, c in sorted(rounds.items()) if key in c]
                if rounds and not values and key == args.counter:
                    fail(f'{point}, {binary}: no counter {key}')
                if values:
                    series[binary] = values
            medians = {binary: statistics.median(values) for binary, values in series.items()}
            for binary, values in series.items():
                line = f'  {label:<28} {binary:<{width}}  ' + ' '.join(f'{v:9.1f}' for v in values)
                line += f'   median {medians[binary]:9.1f}'
                if binary != base and base in medians and key == args.counter:
                    line += f'   {base} / this {medians[base] / medians[binary]:.3f}'
                print(line)

if __name__ == '__main__':
    main()
