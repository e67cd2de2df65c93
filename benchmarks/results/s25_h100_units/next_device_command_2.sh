#!/usr/bin/env bash
# For the next session, after next_device_command.sh on the same machine: the one-launch pass with weight tiles asked
# for once each barrier is passed (read_after_wait), before the stage's own inputs from L2, so that their round trip
# overlaps that one without slowing the stage before (as asking between arrival and wait did: o_proj paid for gate's
# and up's tiles in the twenty-fifth session); and each attention unit's first 1, 2 or 4 tiles of the cache asked
# into L2 before it makes its query ready (kv_ahead), and its query's halves joined in registers rather than stored
# and read back (q_in_registers). All built offline under Triton 3.6 only. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
(cd benchmarks/scripts && timeout 300 python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"read_after_wait": 11}' --variant '{"preload": 31, "read_after_wait": 20}' \
  --variant '{"preload": 31, "read_after_wait": 31}' --variant '{"preload": 31, "read_after_wait": 4}' \
  --variant '{"kv_ahead": 1}' --variant '{"kv_ahead": 2}' --variant '{"kv_ahead": 4}' \
  --variant '{"q_in_registers": true}' --variant '{"q_in_registers": true, "kv_ahead": 2}' --variant '{}' \
  > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
timeout 120 python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -1 $R/tests.txt
tar -czf $OUT/results.tgz -C $OUT r
