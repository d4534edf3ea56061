#!/usr/bin/env python3
"""Every committed results file (reports/**/results.json, reports/**/machine.json, reports/baselines/*.json) names the
commit it was built from (context.git_sha / git_sha, and the calibration's context.machine.git_sha), from a clean
build, and that commit is in this history.
Exit 1 naming each file that does not; 0 otherwise. (In a shallow clone, reachability is not checked: said so.)"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args):
    return subprocess.run(['git', '-C', ROOT] + list(args), capture_output=True, text=True)


def main():
    listed = git('ls-files', 'reports').stdout.split()
    files = [f for f in listed if f.endswith('.json') and (os.path.basename(f) in ('results.json', 'machine.json')
                                                            or f.startswith('reports/baselines/'))]
    shallow = git('rev-parse', '--is-shallow-repository').stdout.strip() == 'true'
    if shallow:
        print('shallow clone: commits are checked for being clean, not for being in this history')
    bad = 0
    for f in files:
        with open(os.path.join(ROOT, f)) as fh:
            data = json.load(fh)
        context = data.get('context', {})
        shas = [('git_sha', context.get('git_sha') or data.get('git_sha') or '')]
        if isinstance(context.get('machine'), dict):  # the calibration the run's roofline fractions came from
            shas.append(('context.machine.git_sha', context['machine'].get('git_sha') or ''))
        for field, sha in shas:
            if not sha or sha == 'unknown' or sha.endswith('-dirty'):
                print('%s: %s %r: expected the clean commit it was built from (scripts/reproduce.sh refuses '
                      'dirty builds)' % (f, field, sha))
                bad += 1
            elif not shallow and git('merge-base', '--is-ancestor', sha, 'HEAD').returncode != 0:
                print('%s: %s %s: not a commit in this history' % (f, field, sha))
                bad += 1
    print('%d results files checked, %d bad' % (len(files), bad))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
