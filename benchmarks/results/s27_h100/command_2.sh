#!/usr/bin/env bash
# Twenty-seventh session, command 2: where W1's time goes beyond its floor, GPU busy or GPU idle, by step kind
# (benchmarks/scripts/w1_step_timeline.py's buckets, over every step of the second of two runs). $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
timeout 300 python3 benchmarks/scripts/w1_step_timeline.py $R/timeline.json --decode-at 300 > $R/timeline.log 2>&1; echo "exit $?"
grep -E "^W1|^buckets" $R/timeline.log; tail -3 $R/timeline.log | cut -c1-300
tar -czf $OUT/results.tgz -C $OUT r
