#!/usr/bin/env bash
# A/B in one device command: attention over the FP8 KV cache computing in float16 for bf16 queries (C, the tree
# as it is) against computing in bf16 (A, the tree rewritten in place by this script). Each side runs the decode
# kernel sweep over the FP8 cache and W1 on random-llama3-8b with FP8 weights and the FP8 cache. Before them, W1
# on the same model in bf16 and with FP8 weights alone, the baselines of #21's FP8 target.
#   bash benchmarks/scripts/ab_fp8_cache_fp16.sh OUT
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
run w1_llama3_8b_bf16 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256
run w1_llama3_8b_fp8 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 --quantization fp8
side() {
  python3 benchmarks/scripts/sweep_decode_kv_dtype.py --kv-dtypes fp8 --label "$1" --output-json "$out/decode_fp8_$1.json" > "$out/decode_fp8_$1.log" 2>&1
  echo "== sweep $1: exit $?"; tail -8 "$out/decode_fp8_$1.log"
  run "w1_llama3_8b_fp8_kv_$1" bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 --quantization fp8 --kv-cache-dtype fp8
}
side C_fp16
rewrite raygrid/kernels/triton_attention.py "return k_cache.dtype == torch.float8_e4m3fn and query.dtype == torch.bfloat16" "return False"
export RAYGRID_GIT_COMMIT="${RAYGRID_GIT_COMMIT:-}-bf16"
side A_bf16
git checkout raygrid/kernels/triton_attention.py 2>/dev/null || true
