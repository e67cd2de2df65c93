#!/usr/bin/env bash
# Twenty-fifth session, third command: 4-row gate_up_proj and down_proj units (down_proj's K whole) against the
# default 8-row ones, alternating in the pass script and end to end (bench latency with RAYGRID_PERSISTENT_CONFIG).
# $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-520} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
(cd benchmarks/scripts && timeout $(left 150) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"mlp_rows_per_unit": 4}' --variant '{"mlp_rows_per_unit": 8}' --variant '{"mlp_rows_per_unit": 4}' \
  > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 2)
four='{"mlp_rows_per_unit": 4}'
timeout $(left 230) bash -c "$(declare -f rg run); out=$R; run lat_8_1 ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG="$four" timeout $(left 310) bash -c "$(declare -f rg run); out=$R; run lat_4_1 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 390) bash -c "$(declare -f rg run); out=$R; run lat_8_2 ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG="$four" timeout $(left 470) bash -c "$(declare -f rg run); out=$R; run lat_4_2 ${lat[*]}" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
