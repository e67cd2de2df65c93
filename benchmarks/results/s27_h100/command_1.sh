#!/usr/bin/env bash
# Twenty-seventh session, command 1: would a decode step gain by running its batch as two halves on two streams?
# benchmarks/scripts/nano_batch_overlap.py at W1-like contexts, then at the profile's 512. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout 240 python3 benchmarks/scripts/nano_batch_overlap.py $R/overlap_w1.json --batches 32 64 128 192 256 --contexts 300 1800 2>&1 | tail -8
timeout 120 python3 benchmarks/scripts/nano_batch_overlap.py $R/overlap_512.json --batches 128 256 --contexts 512 512 2>&1 | tail -3
tar -czf $OUT/results.tgz -C $OUT r
