# one H200, 2026-12-03, tree 8ac74dc (the command's prefix sets RAYGRID_GIT_COMMIT=8ac74dc)
#!/usr/bin/env bash
# Decode attention launches with 1 and 2 warps (bf16 and FP8 caches, 64-token pages), then W1 on random-qwen3-0.6b
# with the default launch (A) and the sweep's best bf16 launch for W1's full batches (B), alternating.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
timeout 330 python3 benchmarks/scripts/sweep_decode_kv_dtype.py --output-json $R/sweep_decode_warps.json > $R/sweep_decode_warps.log 2>&1; echo "sweep $?"
grep -E "seqs=256 context=530" $R/sweep_decode_warps.log | awk '{print $1,$5,$7,$8,$9,$10,$11,$12}' | sort -t= -k9 -n | head -50
B=$(python3 benchmarks/scripts/pick_decode_launch.py $R/sweep_decode_warps.json bfloat16 16x8x256x530,16x8x192x862)
F=$(python3 benchmarks/scripts/pick_decode_launch.py $R/sweep_decode_warps.json fp8 32x8x256x530,32x8x128x1200)
echo "bf16 pick: $B"; echo "fp8 pick: $F"; echo "$B" > $R/pick_bf16.json; echo "$F" > $R/pick_fp8.json
for round in 1 2; do
  unset RAYGRID_DECODE_CONFIG
  run w1_A_$round bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
  export RAYGRID_DECODE_CONFIG="$B"
  run w1_B_$round bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
done
true
