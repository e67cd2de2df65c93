#!/usr/bin/env bash
# Twentieth session, command 4 (2fbe074's engine; the working tree differed only by 0-default KV_PREFETCH code),
# on the H200 that ran command 3, warm: batch-1 latency at 8k and 32k, raygrid, transformers, raygrid.
export PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=2fbe074 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
out=$OUT; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 8192 32768 --output-len 64)
run lat_raygrid_1 "${lat[@]}" --num-iters 3; run lat_hf "${lat[@]}" --num-iters 2 --backend hf; run lat_raygrid_2 "${lat[@]}" --num-iters 3
