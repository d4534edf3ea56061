#!/usr/bin/env python3
"""Runs dslab's generation engine on a checkpoint written by scripts/make_checkpoint.py --config and compares its logits
and greedy tokens with transformers' (golden.json, golden.safetensors in the checkpoint folder).

dslab is fed transformers' tokens after each prompt (the trace's "continuation": teacher forcing), so every row is
compared even where a near-tie would have sent the two engines different ways; its own greedy choice at every row is
compared with transformers'. Rows: the last prompt position, then each decode step.

The bar: bf16 arithmetic lands away from float32 by itself (routing near-ties flip experts, greedy near-ties flip
tokens), so the yardstick is transformers' own bf16 run of the same checkpoint (logits_bf16.r<N>, fed the same
tokens): dslab's median and worst row error against float32 within max(--tolerance, 1.5 x transformers-bf16's), and
each greedy token of dslab's that is off float32's at a pair the row's own error can swap: float32's top-2 gap at most
3 x the row's relative error x the row's RMS (an error that size moves a logit by about that much).

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
    rows, ours, theirs, our_flips, their_flips, unexplained = [], [], [], 0, 0, 0

    def rel(x, y):
        return float(np.linalg.norm(x - y) / np.linalg.norm(y))

    for r, toks in enumerate(tokens):
        g, w = got['logits.r%d' % r].astype(np.float64), want['logits.r%d' % r].astype(np.float64)
        h = want['logits_bf16.r%d' % r].astype(np.float64) if 'logits_bf16.r%d' % r in want else None
        mine = got['tokens.r%d' % r]
        for s in range(min(len(g), len(w))):
            best = int(np.argmax(w[s]))
            if s < len(toks) and best != toks[s]:
                fail('golden tokens and golden logits disagree at request %d row %d' % (r, s))
            top2 = np.sort(w[s])[-2:]
            gap = float((top2[1] - top2[0]) / np.sqrt(np.mean(w[s] ** 2)))
            row = {'request': r, 'row': s, 'rel_l2': rel(g[s], w[s]), 'dslab_token': int(mine[s]),
                   'transformers_token': best, 'top2_gap_over_rms': gap}
            ours.append(row['rel_l2'])
            if int(mine[s]) != best:
                our_flips += 1
                row['explained_by_row_error'] = row['top2_gap_over_rms'] <= 3 * row['rel_l2']
                unexplained += not row['explained_by_row_error']
            if h is not None:
                row['transformers_bf16_rel_l2'] = rel(h[s], w[s])
                row['transformers_bf16_token'] = int(np.argmax(h[s]))
                theirs.append(row['transformers_bf16_rel_l2'])
                their_flips += row['transformers_bf16_token'] != best
            rows.append(row)
    med, worst = float(np.median(ours)), max(ours)
    if theirs:
        t_med, t_worst = float(np.median(theirs)), max(theirs)
        ok = med <= max(a.tolerance, 1.5 * t_med) and worst <= max(a.tolerance, 1.5 * t_worst) and not unexplained
    else:
        t_med = t_worst = None
        ok = worst <= a.tolerance and our_flips == 0
    summary = {'checkpoint': a.checkpoint, 'requests': len(prompts), 'prompt_lengths': [len(x) for x in prompts],
               'rows': len(rows), 'median_rel_l2': med, 'worst_rel_l2': worst, 'greedy_tokens_off_float32': our_flips,
               'greedy_tokens_off_unexplained': unexplained,
               'transformers_bf16': {'median_rel_l2': t_med, 'worst_rel_l2': t_worst,
                                     'greedy_tokens_off_float32': their_flips} if theirs else None,
               'tolerance': a.tolerance, 'pass': ok, 'transformers': golden.get('transformers'),
               'transformers_device': golden.get('device'), 'detail': rows}
    with open(os.path.join(a.out, 'comparison.json'), 'w') as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(a.out, 'comparison.md'), 'w') as f:
        f.write('# dslab against transformers %s (%s) on %s\n\n' % (golden.get('transformers'), golden.get('device'),
                                                                  a.checkpoint))
        lengths = ', '.join(str(len(x)) for x in prompts)
        f.write('%d requests (prompts of %s tokens), %d rows (the last prompt position and each decode step, '
                'transformers\' float32 tokens fed to both). Against transformers in float32, relative L2 of a '
                'row\'s logits, median / worst: dslab %.2e / %.2e' % (len(prompts), lengths, len(rows), med, worst))
        if theirs:
            f.write(', transformers in bf16 %.2e / %.2e' % (t_med, t_worst))
        f.write('; greedy tokens off float32\'s: dslab %d (%d not at a pair its row\'s error can swap)%s. %s\n\n' % (
            our_flips, unexplained, ', transformers-bf16 %d' % their_flips if theirs else '', 'PASS' if ok else 'FAIL'))
        f.write('| request | row | dslab rel. L2 | transformers-bf16 rel. L2 | dslab token | bf16 token | '
                'float32 token | top-2 gap / RMS |\n|---|---|---|---|---|---|---|---|\n')
        for x in rows:
            bf16_err = '%.2e' % x['transformers_bf16_rel_l2'] if theirs else ''
            f.write('| %d | %d | %.2e | %s | %d | %s | %d | %.3g |\n' % (
                x['request'], x['row'], x['rel_l2'], bf16_err, x['dslab_token'], x.get('transformers_bf16_token', ''),
                x['transformers_token'], x['top2_gap_over_rms']))
    yardstick = ('%.2e / %.2e, tokens off %d' % (t_med, t_worst, their_flips)) if theirs else 'not in the golden'
    print('%d rows: dslab median / worst relative L2 %.2e / %.2e, tokens off %d (%d unexplained); transformers-bf16 '
          '%s: %s' % (len(rows), med, worst, our_flips, unexplained, yardstick, 'PASS' if ok else 'FAIL'))
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
