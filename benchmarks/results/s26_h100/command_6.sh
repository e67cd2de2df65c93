#!/usr/bin/env bash
# Twenty-sixth session, command 6 (the warm H100 of command 5): a lone request's latency again, the defaults of 3abd74f
# against the twenty-fifth session's launch (RAYGRID_PERSISTENT_CONFIG), twice each, interleaved: command 5's first
# latency run followed the GPU suite and its 512 and 8,192 TPOT were host noise (1.38 and 1.41 ms).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 3)
for round in 1 2; do
  timeout 100 bash -c "$(declare -f rg run); out=$R; run lat_new_$round ${lat[*]}" | grep -E "^input|exit"
  RAYGRID_PERSISTENT_CONFIG='{"kv_ahead": 0, "q_in_registers": false}' timeout 100 bash -c "$(declare -f rg run); out=$R; run lat_old_$round ${lat[*]}" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
