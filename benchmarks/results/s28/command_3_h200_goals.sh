#!/usr/bin/env bash
# Twenty-eighth session: #21's goals, if an H200 comes (they are set on one; none had run since 2026-12-05): a lone
# request at 8k and 32k against transformers (raygrid, transformers, raygrid), then W1 twice. The twenty-seventh
# session's command 7 without its clock trace. Carry [".devlite"]; results under $OUT/g. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/g; R=$OUT/g
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 3)
timeout $(left 200) bash -c "$(declare -f rg run); out=$R; run lat1 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 330) bash -c "$(declare -f rg run); out=$R; run lat_hf bench latency --backend hf --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 2" | grep -E "^input|exit"
timeout $(left 420) bash -c "$(declare -f rg run); out=$R; run lat2 ${lat[*]}" | grep -E "^input|exit"
for i in 1 2; do
  timeout $(left 575) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1_$i bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | tail -1
done
tar -czf $OUT/goals.tgz -C $OUT g
