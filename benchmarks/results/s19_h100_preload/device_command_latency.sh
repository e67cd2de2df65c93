#!/usr/bin/env bash
# Nineteenth session, command 5: a lone request's tokens at 512 and 32k, this tree (tiles read ahead in the
# one-launch pass) against b1c8d60 (.devrun/b19), alternating.
out=$1; cd "$(dirname "$0")/.."; . benchmarks/scripts/runs.sh
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 64 --num-iters 3)
timeout 80 bash -c "$(declare -f rg run); out=$out; run lat_head_1 $(printf '%q ' "${lat[@]}")" 2>&1 | grep -i "ttft\|tpot\|exit" | head -4
(cd .devrun/b19 && RAYGRID_GIT_COMMIT=b1c8d60 timeout 80 bash -c "$(declare -f rg run); out=$out; run lat_base_1 $(printf '%q ' "${lat[@]}")" 2>&1 | grep -i "ttft\|tpot\|exit" | head -4)
timeout 80 bash -c "$(declare -f rg run); out=$out; run lat_head_2 $(printf '%q ' "${lat[@]}")" 2>&1 | grep -i "ttft\|tpot\|exit" | head -4
cp .devrun/s19_f.sh $out/device_command.sh
