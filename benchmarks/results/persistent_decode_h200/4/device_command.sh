# session 9 command 4: GPU tests of the persistent decode pass, the pass against the engine's by context, and bench latency with it on and off
out=$1
. benchmarks/scripts/runs.sh
timeout 220 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider --durations=8 \
  -k "persistent or launch_only or one_after_another or kv_sizing" 2>&1 | grep -v -i warn | tail -14 | tee $out/gpu_tests.txt
timeout 150 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_4.json --contexts 512 8192 16384 32768 2>&1 | grep -v -i warn | cut -c1-330
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 16384 --output-len 64 --num-iters 3)
run lat_on_1 "${lat[@]}" 2>&1 | grep -i "tpot\|ttft\|exit\|rror" | head -6
run lat_off "${lat[@]}" --no-persistent-decode 2>&1 | grep -i "tpot\|ttft\|exit\|rror" | head -6
run lat_on_2 "${lat[@]}" 2>&1 | grep -i "tpot\|ttft\|exit\|rror" | head -6
