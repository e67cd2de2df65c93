#!/usr/bin/env bash
# cold start: which Triton variants compile during W1 on a fresh cache; A = HEAD (base_tree), B = num_seqs unspecialized
cd "$(dirname "$0")/.."
R=$OUT/r
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
for side in A B; do
  if [ $side = A ]; then PP=$PWD/.device/base_tree:$PYTHONPATH; else PP=$PYTHONPATH; fi
  export TRITON_CACHE_DIR=/tmp/tcache_$side; rm -rf $TRITON_CACHE_DIR
  PYTHONPATH=$PP timeout 200 python3 benchmarks/scripts/triton_compiles.py $R/compiles_${side}_cold.json > $R/compiles_${side}_cold.log 2>&1
  echo "== $side cold exit $?"; grep -v "^run +" $R/compiles_${side}_cold.log | grep -E "wall_s|variants|compile_s|tok_s|Error" ; grep "^run +" $R/compiles_${side}_cold.log | head -40
done
export TRITON_CACHE_DIR=/tmp/tcache_B
timeout 120 python3 benchmarks/scripts/triton_compiles.py $R/compiles_B_warm.json > $R/compiles_B_warm.log 2>&1
echo "== B warm exit $?"; grep -E "wall_s|variants|compile_s|tok_s" $R/compiles_B_warm.log
true
