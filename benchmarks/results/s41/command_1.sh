#!/usr/bin/env bash
# Forty-first session, on any card: the committed default (head_waits, with the fortieth session's mend) on a GPU at
# last: (1) the GPU suite of the one-launch pass, the engine and the graph buffers (every sampling parameter with and
# without the pass); (2) a lone request at 32k end to end (`bench latency`); (3) on an H200, with the time left, the
# pass at 512, 8,192 and 32,768 tokens (the default against 7 attention stages and 64-key tiles) and its fixed part.
# Carry [".devlite"]; results under $OUT/r. $1: the commit.
. benchmarks/scripts/device_prelude.sh "$1"; out=$R; . benchmarks/scripts/runs.sh
timeout $(left 330) python3 -m pytest -q tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py \
  > $R/gpu_tests.txt 2>&1; echo "gpu tests exit $?"; grep -E "passed|failed|FAILED|Error" $R/gpu_tests.txt | tail -8
tar -czf $OUT/results.tgz -C $OUT r
timeout $(left 450) bash -c "$(declare -f rg run); out=$R; run lat_32k bench latency --model random-qwen3-0.6b --dtype bfloat16 --output-len 64 --input-len 32768 --num-iters 3" | grep -E "^input|exit"
tar -czf $OUT/results.tgz -C $OUT r
if grep -q H200 $R/gpu.txt && [ $(left 570) -gt 60 ]; then
  timeout $(left 560) python3 benchmarks/scripts/persistent_decode_pass.py $R/pass.json --contexts 512 8192 32768 \
    --variant '{}' --variant '{"attention_stages": 7}' --variant '{"block_n": 64, "attention_stages": 5}' > $R/pass.txt 2>&1
  echo "pass exit $?"; python3 benchmarks/results/s23_h100_9136e56/passsum.py $R/pass.json | tee $R/passsum.txt | cut -c1-160
  python3 benchmarks/scripts/pass_excess.py $R/pass.json --json $R/excess.json | grep -E "launch|fixed" | tee $R/excess.txt
fi
tar -czf $OUT/results.tgz -C $OUT r
