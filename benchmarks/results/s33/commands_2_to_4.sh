#!/usr/bin/env bash
# Thirty-third session, calls 2 to 4, on the machine that s27_h100/command_7.sh (call 1, at 4079895, results in
# 1_latency_w1_4079895/) left warm (H100 80GB HBM3). Carry [".devlite"]; each wrote under $OUT/r.
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD RAYGRID_CACHE=/tmp/rgc PATH=/tmp/site/bin:/usr/local/cuda/bin:$PATH
R=$OUT/r; mkdir -p $R/pass; [ -d /tmp/site ] || bash .devlite/install.sh > /dev/null 2>&1
# 2 (2_rows2_tests_4079895/): the GPU suite (cut at 300 s: its kernels compiled cold), then the two-row one-launch pass
# at 1,024, 2,048 and 20,000 tokens a row (40,000 together, near the engine's cap of 40,960) against the layer-by-layer
# pass; 3: the suite again with 570 s (tests.txt)
export TRITON_CACHE_DIR=/tmp/tcache
timeout 300 python3 -m pytest -p no:cacheprovider -q --durations=10 tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1
timeout 230 python3 benchmarks/scripts/persistent_decode_pass.py $R/pass/rows2.json --rows 2 --contexts 1024 2048 20000 > $R/pass/rows2.log 2>&1
timeout 570 python3 -m pytest -p no:cacheprovider -rs -v --durations=15 tests/test_persistent_decode.py tests/test_gpu.py tests/test_graph_buffers.py > $R/tests.txt 2>&1
# 4 (3_compiles_cold_4079895/): which kernel variants an engine compiles, and when, on an empty Triton cache (W1)
TRITON_CACHE_DIR=$(mktemp -d) timeout 400 python3 benchmarks/scripts/triton_compiles.py $R/compiles_cold.json > $R/compiles_cold.log 2>&1
