#!/usr/bin/env bash
# Twenty-seventh session, command 6 (the same warm H100): the SM clock and power every 50 ms while 32k prompts run
# (raygrid bench latency, 6 prompts), to see whether the prompts that slow within a run follow the clock.
# Carry [".devlite"]; results under $OUT/r, returned as one tarball. $1: the commit.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 RAYGRID_GIT_COMMIT=$1 PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH RAYGRID_CACHE=/tmp/rgc
mkdir -p $OUT/r; R=$OUT/r
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $R/gpu.txt
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 50 > $R/clocks.csv &
SMI=$!
out=$R; . benchmarks/scripts/runs.sh
timeout 300 bash -c "$(declare -f rg run); out=$R; run lat bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 16 --input-len 32768 --num-iters 6" | grep -E "^input|exit"
kill $SMI
python3 - $R/clocks.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
busy = [r for r in rows if float(r[2].split()[0]) > 300]
print(len(rows), "samples,", len(busy), "above 300 W")
for r in busy[::max(1, len(busy) // 40)]:
    print(r[0].strip(), r[1].strip(), r[2].strip(), r[3].strip(), r[4].strip())
PY
tar -czf $OUT/results.tgz -C $OUT r
