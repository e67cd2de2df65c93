# session 9 command 2: the persistent decode pass (tensor-core attention) against the engine's, Qwen3-0.6B shape
out=$1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.draw --format=csv,noheader
timeout 500 python3 benchmarks/scripts/persistent_decode_pass.py $out/pass_2.json --contexts 512 4096 32768 \
  --variant '{"num_warps": 4}' --variant '{"block_n": 128}' --variant '{"num_stages": 3}' 2>&1 | grep -v -i warn | tail -30
