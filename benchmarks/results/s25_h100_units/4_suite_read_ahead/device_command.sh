#!/usr/bin/env bash
# Twenty-fifth session, fourth command, on 0f04132 (4-row gate_up/down units by default): the GPU suite, then the
# pass with each product's first weight tile read ahead (4-row tiles are small: 16 registers gate's or up's, 64
# down_proj's) and with 2-row down_proj units. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-460} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout $(left 340) python3 -m pytest -p no:cacheprovider -q --durations=5 tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1
echo "tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|FAILED|Error" $R/tests.txt | tail -5
(cd benchmarks/scripts && timeout $(left 455) python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"preload": 11}' --variant '{"preload": 31}' --variant '{"preload": 23}' --variant '{"down_rows_per_unit": 2}' \
  > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
tar -czf $OUT/results.tgz -C $OUT r
