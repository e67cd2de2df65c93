#!/usr/bin/env bash
# Twenty-eighth session, command 2: command 1's sweep again with `bench latency`'s batch figures (83b30f6): the
# batch's prefill and its decode step while every request decodes, against that step's memory floor, by batch size
# (1 to 16) and context (512, 8k, 32k); 128 tokens a request, so that even 16 x 32k has steps of the whole batch.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
out=$R; . benchmarks/scripts/runs.sh
for b in 1 2 4 8 16; do
  timeout $(left $((80 + 30 * b))) bash -c "$(declare -f rg run); out=$R; run lat_b$b bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 128 --input-len 512 8192 32768 --num-iters 2 --batch-size $b" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
