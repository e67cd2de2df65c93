#!/usr/bin/env bash
# Twenty-fifth session, second command: the first found 12-row gate_up units (256 of them, one a program, in tiles of
# 16 rows) slower than 8-row ones (384, some programs two), so smaller units: 2, 4 and 6 rows of gate_up_proj, and
# down_proj in 4-row units over K whole. persistent_decode_pass.py only. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
(cd benchmarks/scripts && timeout 300 python3 persistent_decode_pass.py $R/pass.json --contexts 512 8192 32832 \
  --variant '{"mlp_rows_per_unit": 4, "down_rows_per_unit": 8}' \
  --variant '{"mlp_rows_per_unit": 4}' \
  --variant '{"mlp_rows_per_unit": 2, "down_rows_per_unit": 8}' \
  --variant '{"mlp_rows_per_unit": 6, "down_rows_per_unit": 8}' \
  --variant '{"down_rows_per_unit": 4}' \
  > $R/pass.log 2>&1; echo "pass exit $?")
python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt
tar -czf $OUT/results.tgz -C $OUT r
