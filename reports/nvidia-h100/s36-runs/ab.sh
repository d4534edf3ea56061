#!/usr/bin/env bash
# A/B on one host: .device/ab.sh TAG ROUNDS DSLAB_RUN_ARGS...; BINS (default "dslab dslab-base") interleaved, ROUNDS times.
set -u
tag=$1; rounds=$2; shift 2
mkdir -p "$OUT/ab"
for r in $(seq 1 "$rounds"); do
  for b in ${BINS:-dslab dslab-base}; do
    echo "== $tag $b round $r ($(date +%T))"
    timeout "${AB_LIMIT:-300}" "$b" run "$@" --machine "$OUT/machine.json" --out "$OUT/ab/$tag-$b-$r" >"$OUT/ab/$tag-$b-$r.log" 2>&1
    echo "exit $?"
  done
done
