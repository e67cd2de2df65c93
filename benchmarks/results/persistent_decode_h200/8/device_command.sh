# session 9 command 8: the new defaults: kernel and engine GPU tests, the pass at 512/16k/32k, bench latency at 32k with and without
out=$1
. benchmarks/scripts/runs.sh
timeout 100 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider -k "persistent or launch_only" 2>&1 | grep -v -i warn | tail -5 | tee $out/gpu_tests.txt
timeout 60 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_8.json --contexts 512 16384 32768 --replays 30 2>&1 | grep -v -i warn | cut -c1-200
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 32768 --output-len 64 --num-iters 2)
run lat_32k_persistent "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -4
run lat_32k_default "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -4
