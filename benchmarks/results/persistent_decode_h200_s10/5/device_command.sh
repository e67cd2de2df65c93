# session 10 command 5: the final tree: the pass's kernel and engine GPU tests; bench latency at 32k with and without --persistent-decode, alternating
out=$1
. benchmarks/scripts/runs.sh
timeout 150 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider -k "persistent or launch_only" 2>&1 | grep -v -i warn | tail -3 | tee $out/gpu_tests.txt
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64 --num-iters 2)
run lat32k_off_1 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat32k_on_1 "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat32k_off_2 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat32k_on_2 "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -4
