# session 10 command 3: the final tree's GPU tests of the pass; decode kernel with 64-bit page offsets (this tree) against
# 32-bit (the tree before), alternating; bench latency at 512 and 8k with and without --persistent-decode, alternating
out=$1
. benchmarks/scripts/runs.sh
timeout 150 python3 -m pytest tests/test_persistent_decode.py tests/test_gpu.py -q -p no:cacheprovider -k "persistent or launch_only" 2>&1 | grep -v -i warn | tail -3 | tee $out/gpu_tests.txt
mkdir -p /tmp/b && cp -r raygrid benchmarks /tmp/b/
rewrite /tmp/b/raygrid/kernels/triton_attention.py "other=0).to(tl.int64)  # past 2**31 elements" "other=0)"
rewrite /tmp/b/raygrid/kernels/triton_attention.py "block.to(tl.int64) * stride_cb" "block * stride_cb"
lat=(bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 8192 --output-len 128 --num-iters 3)
for i in 1 2; do
  run lat_off_$i "${lat[@]}" 2>&1 | grep -i "tpot\|ttft\|exit\|rror" | head -6
  run lat_on_$i "${lat[@]}" --persistent-decode 2>&1 | grep -i "tpot\|ttft\|exit\|rror" | head -6
done
for i in 1 2; do
  echo "== 64-bit $i"; timeout 60 python3 benchmarks/scripts/sweep_decode_attention.py --default-config-only --output-json $out/decode_64bit_$i.json 2>&1 | grep -v -i warn | tail -n 8
  echo "== 32-bit $i"; (cd /tmp/b && PYTHONPATH=/tmp/site:/tmp/b timeout 60 python3 benchmarks/scripts/sweep_decode_attention.py --default-config-only --output-json $out/decode_32bit_$i.json 2>&1 | grep -v -i warn | tail -n 8)
done
