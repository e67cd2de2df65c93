#!/usr/bin/env bash
# Nineteenth session, command 3: W1 against b1c8d60 (.devrun/b19), alternating, then a 32k prompt's TTFT and a lone
# request's tokens layer by layer (--no-persistent-decode) at 8k, this tree against b1c8d60.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv,noheader
A_COMMIT=b1c8d60 timeout 330 bash benchmarks/scripts/ab_w1.sh $out/w1 .devrun/b19 2 --model random-qwen3-0.6b --num-prompts 256 2>&1 | grep -i "tok/s\|exit\|imports" | head -12
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 8192 32768 --output-len 64 --num-iters 3 --no-persistent-decode)
(cd .devrun/b19 && RAYGRID_GIT_COMMIT=b1c8d60 timeout 110 bash -c "$(declare -f rg run); out=$out; run lat_base $(printf '%q ' "${lat[@]}")" 2>&1 | grep -i "ttft\|tpot\|exit" | head -6)
timeout 110 bash -c "$(declare -f rg run); out=$out; run lat_head $(printf '%q ' "${lat[@]}")" 2>&1 | grep -i "ttft\|tpot\|exit" | head -6
cp .devrun/s19_d.sh $out/device_command.sh
