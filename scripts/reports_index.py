#!/usr/bin/env python3
"""Topics of committed results (workloads/topics.json) and the device index (reports/<device>/README.md).

  --names            the topic names, space-separated
  --list             each topic and what it runs
  --spec TOPIC       what scripts/reproduce.sh runs: "calibrate", "SWEEP NEEDS_GPU SUITE..." or
                     "generate NEEDS_GPU ARGUMENT..."
  --checkpoint TOPIC the model config whose random full-size checkpoint the topic runs (--weights), or nothing
  --index DIR        rewrite DIR/README.md (DIR = reports/<device>) from the topic sets present in DIR
Standard library only (it also runs on bare GPU machines)."""
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPICS = os.path.join(ROOT, 'workloads', 'topics.json')


def topics():
    with open(TOPICS) as f:
        return json.load(f)['topics']


def matches(entry, where):
    axes = dict(entry.get('axes', {}))
    if 'concurrency' in entry:  # (dslab generate's runs)
        axes['concurrency'] = entry['concurrency']
    # (a list: any of its values)
    return all(str(axes.get(k)) in [str(x) for x in (v if isinstance(v, list) else [v])] for k, v in where.items())


def value_of(entry, spec):
    if 'generation' in spec:
        v = entry.get('generation', {})
        for part in spec['generation'].split('.'):
            v = v.get(part) if isinstance(v, dict) else None
    elif 'counter' in spec:
        v = entry.get('counters', {}).get(spec['counter'])
    else:
        v = entry.get(spec.get('field', 'real_time'))
    return float(v) * spec.get('scale', 1) if isinstance(v, (int, float)) and math.isfinite(v) else None


def headline(spec, results):
    """One headline's text from a topic's results, or None where its points are absent."""
    entries = [b for b in results['benchmarks'] if b.get('run_type', 'iteration') == 'iteration']
    fmt = spec.get('format', '%.3g')
    if spec.get('kind') == 'ratio':
        where = spec.get('where', {})
        base = [e for e in entries if e['variant'] == spec['variant'] and matches(e, where)
                and matches(e, spec.get('where_variant', {}))]
        over = [e for e in entries if e['variant'] == spec['over'] and matches(e, where)
                and matches(e, spec.get('where_over', {}))]
        keys = spec.get('match')

        def key(e):  # within one suite (its variants sampled together), unless the headline says across_suites
            axes = e.get('axes', {})
            suite = None if spec.get('across_suites') else e.get('suite')
            return json.dumps([suite, {k: axes.get(k) for k in (keys or axes.keys())}], sort_keys=True)
        by_key = {key(e): e for e in over}
        ratios = []
        for e in base:
            o = by_key.get(key(e))
            a, b = value_of(e, spec), value_of(o, spec) if o else None
            if a and b:
                ratios.append(b / a)
        if not ratios:
            return None
        lo, hi = min(ratios), max(ratios)
        text = '%.2f' % lo if abs(hi - lo) < 0.005 else '%.2f-%.2f' % (lo, hi)
        return text, '%d points' % len(ratios)
    for e in entries:
        if spec.get('variant', e.get('variant')) == e.get('variant') and matches(e, spec.get('where', {})):
            v = value_of(e, spec)
            if v is not None:
                return fmt % v, ', '.join('%s %s' % (k, v2) for k, v2 in spec.get('where', {}).items())
    return None


def calibration_headline(spec, machine):
    node = machine
    for part in spec['key'].split('.'):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, (int, float)):
        return None
    return '%.3g %s' % (node * spec.get('scale', 1), spec.get('unit', '')), ''


def index(folder):
    device = os.path.basename(os.path.normpath(folder))
    lines = ['# %s: current results by topic' % device, '',
             'Each topic\'s set (results.json, report.md, plots/) comes from a clean commit through the command on its',
             'line, which reruns it on this device and rewrites the set and its line here; git history keeps the earlier',
             'sets. What the topics run: `workloads/topics.json`.', '',
             '| topic | headline | value | point | commit | set | command |', '|---|---|---|---|---|---|---|']
    for name, topic in topics().items():
        cmd = '`scripts/reproduce.sh --device %s %s`' % (device, name)
        where = os.path.join(folder, name)
        calibrate = bool(topic.get('calibrate'))
        set_file = 'machine.json' if calibrate else 'results.json'
        path = os.path.join(where, set_file)
        if not os.path.exists(path):
            lines.append('| %s | not reproduced on this device yet | | | | | %s |' % (name, cmd))
            continue
        with open(path) as f:
            data = json.load(f)
        if calibrate:
            sha, link = data.get('git_sha', '?'), '[machine.json](%s/machine.json)' % name
        else:
            sha, link = data['context'].get('git_sha', '?'), '[report](%s/report.md)' % name
        for spec in topic['headline']:
            h = calibration_headline(spec, data) if calibrate else headline(spec, data)
            if calibrate and not h:
                continue  # (a ceiling this machine has not measured, e.g. no GPU)
            value, point = h if h else ('(no such point in the set)', '')
            lines.append('| %s | %s | %s | %s | %s | %s | %s |' % (name, spec['label'], value, point, sha, link, cmd))
    with open(os.path.join(folder, 'README.md.partial'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.replace(os.path.join(folder, 'README.md.partial'), os.path.join(folder, 'README.md'))


def main(argv):
    if len(argv) == 2 and argv[1] == '--names':
        print(' '.join(topics()))
    elif len(argv) == 2 and argv[1] == '--list':
        for name, t in topics().items():
            what = ('dslab calibrate' if t.get('calibrate') else 'dslab generate ' + ' '.join(t['generate'])
                    if 'generate' in t else '%s, suites %s' % (t['sweep'], ', '.join(t['suites'])))
            ckpt = ', on a random checkpoint of ' + t['checkpoint'] if 'checkpoint' in t else ''
            print('%-18s %s%s%s' % (name, what, ckpt, ' (GPU)' if t.get('gpu') else ''))
    elif len(argv) == 3 and argv[1] == '--spec':
        t = topics().get(argv[2])
        if t is None:
            print('reports_index: topic %r: expected one of %s' % (argv[2], ' '.join(topics())), file=sys.stderr)
            return 2
        if t.get('calibrate'):
            print('calibrate')
        elif 'generate' in t:
            print(' '.join(['generate', '1' if t.get('gpu') else '0'] + t['generate']))
        else:
            print(' '.join([t['sweep'], '1' if t.get('gpu') else '0'] + t['suites']))
    elif len(argv) == 3 and argv[1] == '--checkpoint':
        t = topics().get(argv[2])
        if t is None:
            print('reports_index: topic %r: expected one of %s' % (argv[2], ' '.join(topics())), file=sys.stderr)
            return 2
        print(t.get('checkpoint', ''))
    elif len(argv) == 3 and argv[1] == '--index':
        if not os.path.isdir(argv[2]):
            print('reports_index: %s: not a folder' % argv[2], file=sys.stderr)
            return 2
        index(argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
