#!/usr/bin/env bash
# Twenty-fifth session, fifth command, on a3d4a3c (down_proj's tile read ahead by default): the pass's GPU tests and
# the engine's (every sampling parameter with the pass against without), then a lone request's latency, the default
# against the read-ahead of 0f04132 (RAYGRID_PERSISTENT_CONFIG '{"preload": 3}'), alternating. Its files come back as they are (seven, under eight), so a cut run keeps what it wrote. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-255} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(left 95) python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py tests/test_gpu.py -k "one_launch or persistent_decode" > $R/tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; tail -1 $R/tests.txt
out=$R; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 2)
timeout $(left 155) bash -c "$(declare -f rg run); out=$R; run lat_11_1 ${lat[*]}" | grep -E "^input|exit"
RAYGRID_PERSISTENT_CONFIG='{"preload": 3}' timeout $(left 205) bash -c "$(declare -f rg run); out=$R; run lat_3 ${lat[*]}" | grep -E "^input|exit"
timeout $(left 255) bash -c "$(declare -f rg run); out=$R; run lat_11_2 ${lat[*]}" | grep -E "^input|exit"
