#!/usr/bin/env python3
# sm_weights.py LOG...: each SM's mean per-block us over the "smrate cta sm blocks per_block done" lines, one a line by SM id
import sys, collections
rates = collections.defaultdict(list)
for path in sys.argv[1:]:
    for line in open(path):
        at = line.find('smrate ')
        if at < 0: continue
        f = line[at:].split()
        try:
            sm, per_block = int(f[2]), float(f[4])
        except (IndexError, ValueError):
            continue  # (a line the progress output broke)
        if per_block > 0: rates[sm].append(per_block)
n = max(rates) + 1
mean_all = sum(sum(v) for v in rates.values()) / sum(len(v) for v in rates.values())
for sm in range(n):
    v = rates.get(sm)
    print('%.5f' % (sum(v) / len(v) if v else mean_all))
