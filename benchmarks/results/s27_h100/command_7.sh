#!/usr/bin/env bash
# Twenty-seventh session, command 7 (whichever card comes; an H200 is what #21's goals are set on): a lone request at
# 8k and 32k against transformers (raygrid, transformers, raygrid), W1 twice, with the SM clock and power every 50 ms.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 50 > $R/clocks.csv &
SMI=$!
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 3)
timeout $(left 200) bash -c "$(declare -f rg run); out=$R; run lat1 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 330) bash -c "$(declare -f rg run); out=$R; run lat_hf bench latency --backend hf --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 2" | grep -E "^input|exit"
timeout $(left 420) bash -c "$(declare -f rg run); out=$R; run lat2 ${lat[*]}" | grep -E "^input|exit"
for i in 1 2; do
  timeout $(left 555) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1_$i bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | tail -1
done
kill $SMI
tar -czf $OUT/results.tgz -C $OUT r
