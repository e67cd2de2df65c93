#!/usr/bin/env bash
# Thirty-fourth session, call 3: decode batches of 17 to 256 rows through the skinny kernel's row tiles
# (RAYGRID_SKINNY_MAX_M=256, B) against cuBLAS above 16 rows (the default, A), one tree: W1 alternating A B A B.
# Then the engine's GPU tests with B. Carry [".devlite"]; results under $OUT/r. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
R=$OUT/r; mkdir -p $R; out=$R
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
. benchmarks/scripts/runs.sh
for round in 1 2; do
  [ $(left 400) -lt 60 ] && break
  RAYGRID_SKINNY_MAX_M=16 timeout $(left 400) bash -c "$(declare -f rg run); out=$R; run w1_A_$round bench throughput ${w1[*]} --model random-qwen3-0.6b --num-prompts 256" | grep -E "exit|output"
  RAYGRID_SKINNY_MAX_M=256 timeout $(left 400) bash -c "$(declare -f rg run); out=$R; run w1_B_$round bench throughput ${w1[*]} --model random-qwen3-0.6b --num-prompts 256" | grep -E "exit|output"
  tar -czf $OUT/results.tgz -C $OUT r
done
RAYGRID_SKINNY_MAX_M=256 timeout $(left 560) python3 -m pytest -p no:cacheprovider -q -x tests/test_gpu.py tests/test_graph_buffers.py > $R/gpu_tests_B.txt 2>&1
echo "gpu tests B exit $? ($(( $(date +%s) - t0 )) s)"; tail -2 $R/gpu_tests_B.txt
tar -czf $OUT/results.tgz -C $OUT r
