#!/usr/bin/env bash
# Thirty-fourth session, call 2: the skinny linear kernel with row tiles (several a column block) against cuBLAS at
# W1's decode batches, 32 to 256 rows, Qwen3-0.6B's four weights, each a chain of 28 launches over 28 weights in one
# CUDA graph (sweep_skinny_linear.py --rows); then the four as 28 layers, per layer, cuBLAS / default / each best.
# cuBLAS takes about 30 us a layer at 256 rows where the weights' read is 7.5 us and the compute 11 (an H200).
# Then the kernel's GPU test (row tiles of 64 and more). Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
R=$OUT/r; mkdir -p $R
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout $(left 120) python3 -m pytest -p no:cacheprovider -q tests/test_kernels.py -k skinny > $R/kernel_test.txt 2>&1
echo "kernel test exit $? ($(( $(date +%s) - t0 )) s)"; tail -1 $R/kernel_test.txt
timeout $(left 540) python3 benchmarks/scripts/sweep_skinny_linear.py --output-json $R/sweep_rows.json --budget-s 330 \
  --rows 256 128 64 192 32 > $R/sweep_rows.txt 2>&1
echo "sweep exit $? ($(( $(date +%s) - t0 )) s)"; grep -E "M=|layer chain" $R/sweep_rows.txt | cut -c1-200
tar -czf $OUT/results.tgz -C $OUT r
