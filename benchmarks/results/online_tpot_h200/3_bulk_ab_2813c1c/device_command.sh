#!/usr/bin/env bash
# One H200 (2026-12-03, eighth session), second command: the GPU tests again (the first command's bundle carried
# llguidance 1.6.1, which the tests' structured outputs cannot use), the decode sweep over W1's unequal contexts
# with bulk copies (never run before), then W1 on random-qwen3-0.6b: the default decode launch (A, bulk copies only
# where contexts split) against bulk copies everywhere (B, RAYGRID_DECODE_CONFIG='{"tma": true}'), alternating.
cd "$(dirname "$0")/../../../.."
R=$OUT/r; mkdir -p $R
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
timeout 120 python3 benchmarks/scripts/sweep_decode_attention.py --order --order-launches 64x4x2 --order-bulk \
  --output-json $R/order_bulk_bf16.json > $R/order_bulk_bf16.log 2>&1; echo "sweep $?"; cat $R/order_bulk_bf16.log | tail -30
. benchmarks/scripts/runs.sh
out=$R
for i in 1 2; do
  run w1_A_$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
  RAYGRID_DECODE_CONFIG='{"tma": true}' run w1_B_$i bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
done
true
