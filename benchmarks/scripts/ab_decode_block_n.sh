#!/usr/bin/env bash
# A/B in one device command: the decode kernel stepping 64 keys at a time (A) against 128 (B), both set by
# RAYGRID_DECODE_CONFIG. Each side: W1 on random-qwen3-0.6b (bf16 cache) and on random-llama3-8b with FP8 weights
# and the FP8 cache. (Run at a758e8b, whose only key was block_n and whose default was 64.)
#   bash benchmarks/scripts/ab_decode_block_n.sh OUT
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
side() {
  run "w1_qwen3_0.6b_$1" bench throughput --model random-qwen3-0.6b "${w1[@]}"
  run "w1_llama3_8b_fp8_kv_$1" bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 --quantization fp8 --kv-cache-dtype fp8
}
RAYGRID_DECODE_CONFIG='{"block_n": 64, "fp8_block_n": 64}' side A_block_n_64
commit=${RAYGRID_GIT_COMMIT:-}
RAYGRID_GIT_COMMIT="$commit+decode_block_n_128" RAYGRID_DECODE_CONFIG='{"block_n": 128, "fp8_block_n": 128}' side B_block_n_128
