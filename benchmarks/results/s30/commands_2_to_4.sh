#!/usr/bin/env bash
# Thirtieth session, calls 2 to 4, on the machine command 1 left warm (H100 80GB HBM3), at 470a930 (max_rows 2).
# Carry [".devlite"]; each wrote under $OUT/r (copied to 2_engine_tests_470a930/, 3_w1_split_ab_470a930/, 4_latency_470a930/).
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_CACHE=/tmp/rgc TRITON_CACHE_DIR=/tmp/tcache RAYGRID_GIT_COMMIT=470a930
[ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
R=$OUT/r; mkdir -p $R
# 2: the engine's GPU test of the one-launch pass (1 and 2 rows) against the layer-by-layer engine
timeout 300 python3 -m pytest -q -p no:cacheprovider --durations=5 tests/test_gpu.py -k "persistent_decode_equals" > $R/tests2.txt 2>&1
# 3: W1 step by step on one engine, the split of a step's attention off and on, twice each
timeout 270 python3 benchmarks/scripts/w1_step_timeline.py $R/timeline_split.json \
  --prefill-tile-choices '{"split_decode_rows": 0}' '{}' '{"split_decode_rows": 0}' '{}' > $R/timeline_split.log 2>&1
# 4: bench latency at batches 2 and 1
out=$R; . benchmarks/scripts/runs.sh
for b in 2 1; do
  timeout 100 bash -c "$(declare -f rg run); out=$R; run lat_b$b bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 512 8192 --num-iters 2 --batch-size $b"
done
