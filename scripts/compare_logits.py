#!/usr/bin/env python3
"""Runs dslab's generation engine on a checkpoint written by scripts/make_checkpoint.py --config and compares its logits
and greedy tokens with transformers' (golden.json, golden.safetensors in the checkpoint folder).

dslab is fed transformers' tokens after each prompt (the trace's "continuation": teacher forcing), so every row is
compared even where a near-tie would have sent the two engines different ways; its own greedy choice at every row is
compared with transformers'. Rows: the last prompt position, then each decode step. Tolerance: relative L2 of a
row's logits <= --tolerance (default 2e-2: bf16 weights, activations and cache against transformers' float32).

Usage: scripts/compare_logits.py --checkpoint DIR [--dslab build/dslab] [--out DIR] [--tolerance 0.02]
       [--axis NAME=VALUE ...] (dslab generate's engine axes)
Writes OUT/comparison.json and OUT/comparison.md (and dslab's results.json, report.md); exit 1 if a bar is missed."""
import argparse
import json
import os
import subprocess
import sys


def fail(msg):
    print('compare_logits: ' + msg, file=sys.stderr)
    sys.exit(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--checkpoint', required=True)
    p.add_argument('--dslab', default='build/dslab')
    p.add_argument('--out', default='results/compare-logits')
    p.add_argument('--tolerance', type=float, default=2e-2)
    p.add_argument('--axis', action='append', default=[])
    a = p.parse_args()
    try:
        import numpy as np
        from safetensors.numpy import load_file
    except ImportError as e:
        fail('needs numpy and safetensors (%s)' % e)
    golden_path = os.path.join(a.checkpoint, 'golden.json')
    try:
        with open(golden_path) as f:
            golden = json.load(f)
        prompts, tokens = golden['prompts'], golden['tokens']
        want = load_file(os.path.join(a.checkpoint, 'golden.safetensors'))
    except (OSError, ValueError, KeyError) as e:
        fail('%s: %s (expected make_checkpoint.py --config output)' % (golden_path, e))
    os.makedirs(a.out, exist_ok=True)
    trace = os.path.join(a.out, 'trace.jsonl')
    with open(trace, 'w') as f:
        for prompt, toks in zip(prompts, tokens):
            f.write(json.dumps({'prompt': prompt, 'output_len': len(toks) + 1, 'continuation': toks}) + '\n')
    got_path = os.path.join(a.out, 'dslab_logits.safetensors')
    cmd = [a.dslab, 'generate', '--weights', a.checkpoint, '--trace', trace, '--concurrency', str(len(prompts)),
           '--logits', got_path, '--no-verify', '--out', a.out]
    for ax in a.axis:
        cmd += ['--axis', ax]
    print('$ ' + ' '.join(cmd), flush=True)
    if subprocess.call(cmd) != 0:
        fail('dslab generate failed')
    got = load_file(got_path)
    rows, worst, token_misses = [], 0.0, 0
    for r, toks in enumerate(tokens):
        g, w = got['logits.r%d' % r].astype(np.float64), want['logits.r%d' % r].astype(np.float64)
        mine = got['tokens.r%d' % r]
        for s in range(min(len(g), len(w))):
            err = float(np.linalg.norm(g[s] - w[s]) / np.linalg.norm(w[s]))
            worst = max(worst, err)
            theirs = int(np.argmax(w[s]))
            if s < len(toks) and theirs != toks[s]:
                fail('golden tokens and golden logits disagree at request %d row %d' % (r, s))
            top2 = np.sort(w[s])[-2:]
            rows.append({'request': r, 'row': s, 'rel_l2': err, 'dslab_token': int(mine[s]), 'transformers_token': theirs,
                         'transformers_top2_gap': float(top2[1] - top2[0])})
            token_misses += int(mine[s]) != theirs
    ok = worst <= a.tolerance and token_misses == 0
    summary = {'checkpoint': a.checkpoint, 'requests': len(prompts), 'prompt_lengths': [len(x) for x in prompts],
               'rows': len(rows), 'worst_rel_l2': worst, 'tolerance': a.tolerance,
               'greedy_tokens_differing': token_misses, 'pass': ok, 'transformers': golden.get('transformers'),
               'transformers_device': golden.get('device'), 'detail': rows}
    with open(os.path.join(a.out, 'comparison.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(a.out, 'comparison.md'), 'w') as f:
        f.write('# dslab against transformers %s (%s) on %s\n\n' % (golden.get('transformers'), golden.get('device'),
                                                                  a.checkpoint))
        f.write('%d requests (prompts of %s tokens), %d rows (the last prompt position and each decode step, '
                'transformers\' tokens fed to both): worst relative L2 of a row\'s logits %.2e (tolerance %.0e); '
                'greedy tokens differing: %d.\n\n' % (len(prompts), ', '.join(str(len(x)) for x in prompts), len(rows),
                                                      worst, a.tolerance, token_misses))
        f.write('| request | row | relative L2 | dslab token | transformers token | transformers top-2 gap |\n'
                '|---|---|---|---|---|---|\n')
        for x in rows:
            f.write('| %d | %d | %.2e | %d | %d | %.3g |\n' % (x['request'], x['row'], x['rel_l2'], x['dslab_token'],
                                                            x['transformers_token'], x['transformers_top2_gap']))
    print('%d rows: worst relative L2 %.2e (tolerance %.0e), greedy tokens differing %d: %s' %
          (len(rows), worst, a.tolerance, token_misses, 'PASS' if ok else 'FAIL'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
