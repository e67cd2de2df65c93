#!/usr/bin/env bash
# Twenty-sixth session, command 4 (same warm H100): q_in_registers with kv_ahead 1 or 2, each also with read_after_wait 4
# and preload 31, twice interleaved with the default; then test_persistent_decode with q_in_registers and kv_ahead 2 set
# through RAYGRID_PERSISTENT_CONFIG (the defaults at 0a8719d are neither).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
V=(--variant '{"q_in_registers": true, "kv_ahead": 2}' --variant '{"q_in_registers": true, "kv_ahead": 1}' \
   --variant '{"q_in_registers": true, "kv_ahead": 2, "preload": 31, "read_after_wait": 4}' \
   --variant '{"q_in_registers": true, "kv_ahead": 1, "preload": 31, "read_after_wait": 4}' --variant '{}')
(cd benchmarks/scripts && timeout 240 python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  "${V[@]}" "${V[@]}" > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
RAYGRID_PERSISTENT_CONFIG='{"q_in_registers": true, "kv_ahead": 2}' timeout 100 python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -1 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
