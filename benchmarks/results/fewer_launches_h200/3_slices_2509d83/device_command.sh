#!/usr/bin/env bash
# Unequal contexts: slicing the long ones in full batches (sweep --order with slices), the decode kernel tests, and
# W1 with the default policy (D) against full batches sliced in 2 (S: slices of >= 1024 or 768 tokens; g gathered,
# b bulk copies).
cd "$(dirname "$0")/.."
R=$OUT/r; out=$R
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 150 python3 benchmarks/scripts/sweep_decode_attention.py --order --output-json $R/sweep_decode_order_slices.json > $R/sweep_decode_order_slices.txt 2>&1; echo "order sweep $?"; grep -v Warn $R/sweep_decode_order_slices.txt | tail -4
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode_attention or padding_rows or bulk" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
w1run() { name=$1; policy=$2; config=$3; RAYGRID_DECODE_SPLIT_POLICY="$policy" RAYGRID_DECODE_CONFIG="$config" timeout 60 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput --model random-qwen3-0.6b ${w1[*]}" | grep -E "exit|tok/s|128-255|256" | head -4; }
w1run w1_D1 '{}' '{}'
w1run w1_S1024g '{"full_splits": 2, "full_min_split_tokens": 1024}' '{"tma": false}'
w1run w1_S1024b '{"full_splits": 2, "full_min_split_tokens": 1024}' '{"tma": true}'
w1run w1_S768g '{"full_splits": 2, "full_min_split_tokens": 768}' '{"tma": false}'
w1run w1_D2 '{}' '{}'
true
