#!/usr/bin/env bash
# Twenty-sixth session, command 7 (a fresh H100): the pass's GPU tests on the final tree (one convention for the
# launch's settings, 0278f3a), then W1 with decode profiles (`--profile-dir`: a 256 x 512 step and the run's tail),
# where a W1 decode step's time goes on an H100 now. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r/prof; R=$OUT/r
bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout 150 python3 -m pytest -p no:cacheprovider -q tests/test_persistent_decode.py > $R/tests.txt 2>&1; echo "tests exit $?"; tail -1 $R/tests.txt
out=$R; . benchmarks/scripts/runs.sh
timeout 200 bash -c "$(declare -f rg run); out=$R; w1=(${w1[*]}); run w1 bench throughput \${w1[@]} --model random-qwen3-0.6b --num-prompts 256 --profile-dir $R/prof" | tail -2
ls $R/prof | head; tar -czf $OUT/results.tgz -C $OUT r
