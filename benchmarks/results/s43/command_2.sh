#!/usr/bin/env bash
# Forty-third session, for the next machine, on any card: (1) the shared-memory chain with each tile asked for at the
# stage's end (as measured in 1_command_1_88cce90/), after the program's arrival at the barrier, or once the next
# stage's vector is ready (`--ask`), 4 and 8 warps, each with its timeline: does the barrier still wait for the copy,
# and do the products now overlap it? (2) on an H200, #21's cells (a 32k prompt against transformers with SDPA, the token
# at 32k, W1); on another card the GPU tests of test_gpu.py (the last whole run was at 8444115).
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
timeout $(left 240) python3 benchmarks/scripts/persistent_decode_chain_smem.py --output-json $R/chain_smem.json --timeline \
  > $R/chain_smem.txt 2>&1; echo "chain exit $?"; grep -E "^(engine|registers|smem)" $R/chain_smem.txt | cut -c1-330
tar -czf $OUT/results.tgz -C $OUT r
if grep -q H200 $R/gpu.txt; then
  lat32k lat_rg1 "--output-len 64 --num-iters 3" 330
  lat32k lat_hf "--backend hf --output-len 16 --num-iters 2" 450
  w1run w1_1 560
else
  timeout $(left 560) python3 -m pytest -v -p no:cacheprovider tests/test_gpu.py > $R/test_gpu.txt 2>&1
  echo "test_gpu exit $?"; grep -E "FAILED|ERROR|passed|failed" $R/test_gpu.txt | tail -6
fi
tar -czf $OUT/results.tgz -C $OUT r
