# session 9 command 5: the GPU tests whole, then bench latency with the persistent pass off and on, alternating
out=$1
. benchmarks/scripts/runs.sh
timeout 300 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider --durations=10 2>&1 | grep -v -i warn | tail -40 | tee $out/gpu_tests.txt
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 8192 --output-len 64 --num-iters 3)
run lat_off_1 "${lat[@]}" --no-persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -6
run lat_on_1 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -6
run lat_off_2 "${lat[@]}" --no-persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -6
run lat_on_2 "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -6
