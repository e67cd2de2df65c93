#!/usr/bin/env bash
# Twenty-sixth session, command 5 (a fresh H100): the GPU suite with the query in registers and one cache tile asked
# ahead by default (3abd74f), the pass against the twenty-fifth session's launch, a lone request against transformers, W1.
# Carry [".devlite"] (benchmarks/scripts/device_bundle.sh builds it); results under $OUT/r, returned as one tarball.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 320) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; tail -2 $R/tests.txt
(cd benchmarks/scripts && timeout $(left 360) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"kv_ahead": 0, "q_in_registers": false}' > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 3)
timeout $(left 420) bash -c "$(declare -f rg run); out=$R; run lat ${lat[*]}" | grep -E "^input|exit"
timeout $(left 490) bash -c "$(declare -f rg run); out=$R; run lat_hf bench latency --backend hf --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 8192 32768 --num-iters 2" | grep -E "^input|exit"
timeout $(left 555) bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1 bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256" | tail -2
tar -czf $OUT/results.tgz -C $OUT r
