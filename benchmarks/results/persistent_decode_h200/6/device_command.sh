# session 9 command 6: the final tree's GPU tests (persistent decode off by default), then bench latency at 512 and 8192, default and --persistent-decode alternating, with the SM clock before each
out=$1
. benchmarks/scripts/runs.sh
timeout 300 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider --durations=10 2>&1 | grep -v -i warn | tail -16 | tee $out/gpu_tests.txt
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 8192 --output-len 64 --num-iters 3)
for i in 1 2; do
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
  run lat_default_$i "${lat[@]}" 2>&1 | grep -i "tpot\|exit\|rror" | head -6
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
  run lat_persistent_$i "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|exit\|rror" | head -6
done
