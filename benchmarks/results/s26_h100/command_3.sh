#!/usr/bin/env bash
# Twenty-sixth session, command 3 (same warm H100 as commands 1 and 2): the options that won or tied in command 2,
# each twice, interleaved with the default; then a lone request's TPOT with the best against the default.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
V=(--variant '{"q_in_registers": true, "kv_ahead": 2}' --variant '{"q_in_registers": true, "kv_ahead": 1}' \
   --variant '{"kv_ahead": 1}' --variant '{"preload": 31, "read_after_wait": 4}' --variant '{}')
(cd benchmarks/scripts && timeout 240 python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  "${V[@]}" "${V[@]}" > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 3)
for round in 1 2; do
  timeout 100 bash -c "$(declare -f rg run); out=$R; run lat_default_$round ${lat[*]}" | grep -E "^input|exit"
  RAYGRID_PERSISTENT_CONFIG='{"q_in_registers": true, "kv_ahead": 2}' timeout 100 bash -c "$(declare -f rg run); out=$R; run lat_qkv2_$round ${lat[*]}" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
