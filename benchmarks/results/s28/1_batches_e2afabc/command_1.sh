#!/usr/bin/env bash
# Twenty-eighth session, command 1: a decode step by batch size (1, 2, 4, 8) and context (512, 8k, 32k) against its
# memory floor, then the twenty-seventh session's changed benchmark scripts, run again briefly (its
# next_device_command.sh). Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
t0=$(date +%s); left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); [ $l -lt 5 ] && l=5; echo $l; }
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
out=$R; . benchmarks/scripts/runs.sh
for b in 1 2 4 8; do
  timeout $(left $((60 + 80 * b))) bash -c "$(declare -f rg run); out=$R; run lat_b$b bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 32768 --num-iters 3 --batch-size $b" | grep -E "^input|exit"
done
timeout $(left 440) python3 benchmarks/scripts/nano_batch_overlap.py $R/overlap.json --batches 32 256 --contexts 300 1800 2>&1 | tail -2; echo "overlap exit $?"
(cd benchmarks/scripts && timeout $(left 470) python3 persistent_decode_pass.py $R/pass.json --contexts 512 > $R/pass.log 2>&1; echo "pass exit $?"; tail -1 $R/pass.log | cut -c1-300)
timeout $(left 585) python3 benchmarks/scripts/w1_step_timeline.py $R/timeline.json > $R/timeline.log 2>&1; echo "timeline exit $?"; grep -E "^W1|^buckets" $R/timeline.log
tar -czf $OUT/results.tgz -C $OUT r
