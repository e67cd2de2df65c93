#!/usr/bin/env bash
# Thirty-ninth session, on any card: where the Gluon chain's 12.2 us a layer go (its second run, in command 4, summed
# each layer's slices before the barrier and took as long as the first): each way timed, then one launch of each
# with every program's time at its start, its product done, its arrival and its pass of each barrier
# (`--timeline`), R = 4,096 with slots 1 and 3, and R = 2,048 with slots 1 and 4; with the way that has no weights
# and no product (`barrier_only`: the atomics, the barrier and the fold alone). Carry [".devlite"]; results under
# $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"
timeout $(left 250) python3 benchmarks/scripts/gluon_stream_chain.py $R/chain_4096.json --rows 4096 --slots 1 3 --timeline \
  > $R/chain_4096.txt 2>&1; echo "4096 exit $?"
timeout $(left 450) python3 benchmarks/scripts/gluon_stream_chain.py $R/chain_2048.json --rows 2048 --slots 1 4 --timeline \
  > $R/chain_2048.txt 2>&1; echo "2048 exit $?"
for f in $R/chain_4096.txt $R/chain_2048.txt; do python3 -c "
import json, sys
for line in open(sys.argv[1]):
    if line.startswith('{'):
        d = json.loads(line); print(d['way'], d['slots'], round(d.get('us_a_layer', 0), 2), d.get('timeline', d.get('error')))
" $f; done | tee $R/summary.txt
tar -czf $OUT/results.tgz -C $OUT r
