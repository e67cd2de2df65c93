#!/usr/bin/env bash
# For the next session (never run: no device time was left): the three benchmark scripts changed after their runs (one helper for the dummy
# model, the probe's halves sliced from the whole batch, step kinds from throughput.step_kind), run again briefly.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
timeout 120 python3 benchmarks/scripts/nano_batch_overlap.py $R/overlap.json --batches 32 256 --contexts 300 1800 2>&1 | tail -2; echo "overlap exit $?"
(cd benchmarks/scripts && timeout 120 python3 persistent_decode_pass.py $R/pass.json --contexts 512 > $R/pass.log 2>&1; echo "pass exit $?"; tail -1 $R/pass.log | cut -c1-300)
timeout 200 python3 benchmarks/scripts/w1_step_timeline.py $R/timeline.json > $R/timeline.log 2>&1; echo "timeline exit $?"; grep -E "^W1|^buckets" $R/timeline.log
tar -czf $OUT/results.tgz -C $OUT r
