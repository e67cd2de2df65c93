#!/usr/bin/env bash
# One H200 (2026-12-04), fifth command, at 4eb17fc: batch-1 latency on random-qwen3-0.6b (bf16) at 8k and 32k-token
# prompts under the split policy (3 programs an SM, slices of at least 256 keys) and under 4 programs an SM with
# slices of at least 128 (the long-context sweep's best at 8k, 10.8 against 13.2 us a layer), alternating.
#   bash benchmarks/results/fp8_defer_h200/5_split_4eb17fc/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
R=$1/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
. benchmarks/scripts/runs.sh
out=$R
lat=(--model random-qwen3-0.6b --dtype bfloat16 --input-len 8192 32768 --output-len 128 --num-iters 3)
policy='{"programs_per_sm": 4, "min_split_tokens": 128}'
run lat_default_1 bench latency "${lat[@]}"
RAYGRID_DECODE_SPLIT_POLICY=$policy run lat_4sm_128_1 bench latency "${lat[@]}"
run lat_default_2 bench latency "${lat[@]}"
RAYGRID_DECODE_SPLIT_POLICY=$policy run lat_4sm_128_2 bench latency "${lat[@]}"
true
