#!/usr/bin/env bash
# Twenty-seventh session, command 4 (a fresh H100): the GPU suite on the session's tree (no engine change since
# 75794de, whose watchdog commits came after the last suite), then a 32k prompt: raygrid, transformers, raygrid.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 330) python3 -m pytest -p no:cacheprovider -q --durations=10 tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed" $R/tests.txt | tail -2
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3)
timeout $(left 410) bash -c "$(declare -f rg run); out=$R; run lat1 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 490) bash -c "$(declare -f rg run); out=$R; run lat_hf bench latency --backend hf --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 2" | grep -E "^input|exit"
timeout $(left 565) bash -c "$(declare -f rg run); out=$R; run lat2 ${lat[*]}" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
