#!/usr/bin/env bash
# One H200 (2026-12-04), second command: the prefill kernel's query tiles in two halves (subtiles=2, the new default)
# against whole tiles (RAYGRID_PREFILL_CONFIG='{"subtiles": 1}') in the engine: batch-1 latency at 32k tokens beside
# transformers (SDPA), and W1 on random-qwen3-0.6b alternating.
#   bash benchmarks/results/kernel_sweeps_h200/2_prefill_engine/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
R=$1; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
. benchmarks/scripts/runs.sh
out=$R
lat=(--model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64)
whole='{"subtiles": 1}'
run lat_halves bench latency "${lat[@]}" --num-iters 3
RAYGRID_PREFILL_CONFIG=$whole run lat_whole bench latency "${lat[@]}" --num-iters 3
run lat_hf bench latency --backend hf "${lat[@]}" --num-iters 2
for i in 1 2; do
  run "w1_halves_$i" bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
  RAYGRID_PREFILL_CONFIG=$whole run "w1_whole_$i" bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
done
true
