# session 11 command 2: a batch-1 step's timeline (host phases, GPU start/end) at 512 and 32k, with and without the one-launch pass; bench latency at 32k with the decode launch at 5 stages against 2, alternating
out=$1
. benchmarks/scripts/runs.sh
timeout 120 python3 .devrun/step_timeline.py $out 512 off,on 2>&1 | grep "^off\|^on\|rror" | tail -8
timeout 150 python3 .devrun/step_timeline.py $out 32768 on,off 2>&1 | grep "^off\|^on\|rror" | tail -8
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64 --num-iters 2)
run lat32k_s2_1 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -3
RAYGRID_DECODE_CONFIG='{"num_stages": 5}' run lat32k_s5_1 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -3
run lat32k_s2_2 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -3
RAYGRID_DECODE_CONFIG='{"num_stages": 5}' run lat32k_s5_2 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -3
