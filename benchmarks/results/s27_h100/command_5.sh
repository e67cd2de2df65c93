#!/usr/bin/env bash
# Twenty-seventh session, command 5 (the same warm H100): a 32k prompt's TTFT by step budget (8,192, the default;
# 16,384, vLLM's LLM class on large GPUs; 32,768, one step), alternating twice, then W1 at 8,192 and 16,384.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 16 --input-len 32768 --num-iters 3)
for round in 1 2; do for b in 8192 16384 32768; do
  timeout $(left 440) bash -c "$(declare -f rg run); out=$R; run lat_${b}_$round ${lat[*]} --max-num-batched-tokens $b" | grep -E "^input|exit"
done; done
for b in 8192 16384; do
  timeout $(left 575) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1_$b bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256 --max-num-batched-tokens $b" | tail -1
done
tar -czf $OUT/results.tgz -C $OUT r
