#!/usr/bin/env bash
# Eighteenth session, command 2: batch-1 TTFT and TPOT at 8k and 32k, raygrid against transformers in one command,
# and the split policy the fifteenth session's sweep favoured at 8k (4 programs an SM, slices of at least 128 tokens)
# against the default, alternating; then --persistent-decode.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 8192 32768 --output-len 64)
p4='{"programs_per_sm": 4, "min_split_tokens": 128}'
run lat_default_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
RAYGRID_DECODE_SPLIT_POLICY="$p4" run lat_p4_1 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
run lat_hf "${lat[@]}" --num-iters 2 --backend hf 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
run lat_default_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
RAYGRID_DECODE_SPLIT_POLICY="$p4" run lat_p4_2 "${lat[@]}" --num-iters 3 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
run lat_persistent "${lat[@]}" --num-iters 3 --persistent-decode 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
cp .devrun/s18_c3.sh $out/device_command.sh
