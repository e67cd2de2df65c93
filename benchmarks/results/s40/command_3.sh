#!/usr/bin/env bash
# Fortieth session, on any card, with the last of the device time: the committed default (head_waits) end to end, a
# lone request at 32k (`bench latency`, its floor and TPOT), then the one-launch pass's tests and the engine's with it
# (every sampling parameter). Carry [".devlite"]; results under $OUT/r. $1: the commit, $2: seconds to stay within.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
L=${2:-230}
timeout $(left $((L - 130))) bash -c "$(declare -f rg run); out=$R; run lat_32k bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left $L) python3 -m pytest -q tests/test_gpu.py -k persistent > $R/gpu_tests.txt 2>&1; echo "gpu tests exit $?"; tail -2 $R/gpu_tests.txt
tar -czf $OUT/results.tgz -C $OUT r
