#!/usr/bin/env bash
# Twenty-sixth session, command 8 (a fresh H100, the session's last 279 s of device time): with the query in registers
# and one cache tile ahead (the new default), do the attention loop's tiles and stages, tuned in the twenty-fourth
# session with the query through memory, still hold? For the next session: no default changes without the GPU suite.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
(cd benchmarks/scripts && timeout 160 python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"attention_stages": 4}' --variant '{"attention_stages": 6}' \
  --variant '{"block_n": 64, "attention_stages": 3}' --variant '{"preload": 31}' --variant '{}' \
  > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
