#!/usr/bin/env bash
# Decode grids: kv heads fastest and longest first, swept over W1's unequal contexts (FP8 8B shape, bf16 0.6B shape);
# then W1 on random-qwen3-0.6b, default (A) against heads fastest + longest first (H), alternating.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode or fp8_kv" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
timeout 150 python3 benchmarks/scripts/sweep_decode_attention.py --order --order-launches 128x4x2,32x1x2,64x2x2 --order-kv-dtype fp8 --order-heads 32 --output-json $R/order_fp8.json > $R/order_fp8.log 2>&1; echo "sweep fp8 $?"; cat $R/order_fp8.log
timeout 110 python3 benchmarks/scripts/sweep_decode_attention.py --order --order-launches 64x4x2,32x1x2 --output-json $R/order_bf16.json > $R/order_bf16.log 2>&1; echo "sweep bf16 $?"; cat $R/order_bf16.log
H='{"heads_fastest": true, "longest_first": true}'
for round in 1 2; do
  unset RAYGRID_DECODE_CONFIG
  run w1_A_$round bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
  export RAYGRID_DECODE_CONFIG="$H"
  run w1_H_$round bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
done
true
