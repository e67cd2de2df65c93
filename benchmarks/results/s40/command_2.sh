#!/usr/bin/env bash
# Fortieth session, on the machine command 1 left warm (an H100): the engine's GPU tests of the one-launch pass with
# head_waits on (RAYGRID_PERSISTENT_CONFIG: the engine with the pass against the engine without it, every sampling
# parameter), then a lone request at 32k (`bench latency`), the default and head_waits alternating, twice each.
# Carry [".devlite"]; results under $OUT/r. $1: the commit. (Run as one line; the same steps spelled out.)
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
export RAYGRID_PERSISTENT_CONFIG='{"head_waits": true}'
timeout 200 python3 -m pytest -q -x tests/test_gpu.py -k persistent > $R/gpu_tests_hw.txt 2>&1; echo "gpu tests exit $?"
tail -2 $R/gpu_tests_hw.txt
for c in '{}' '{"head_waits": true}' '{}' '{"head_waits": true}'; do
  export RAYGRID_PERSISTENT_CONFIG="$c"; n=$(echo "$c" | tr -dc a-z | head -c 12)
  timeout $(left 560) bash -c "$(declare -f rg run); out=$R; run lat_${n:-default}_$RANDOM bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
done
tar -czf $OUT/results.tgz -C $OUT r
