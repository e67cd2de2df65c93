#!/usr/bin/env bash
# A/B in one device command: the decode kernel loading each tile's values after the softmax (A, the tree as it
# is) against loading them right after the keys (B, the tree rewritten in place by this script). Each side
# runs the decode kernel sweep over bf16 and FP8 caches, W1 on random-qwen3-0.6b (bf16), and W1 on
# random-llama3-8b with FP8 weights and the FP8 cache.
#   bash benchmarks/scripts/ab_decode_v_load.sh OUT
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
side() {
  python3 benchmarks/scripts/sweep_decode_kv_dtype.py --label "$1" --output-json "$out/decode_kv_dtype_$1.json" > "$out/decode_kv_dtype_$1.log" 2>&1
  run "w1_qwen3_0.6b_$1" bench throughput --model random-qwen3-0.6b "${w1[@]}"
  run "w1_llama3_8b_fp8_kv_$1" bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 --quantization fp8 --kv-cache-dtype fp8
}
side A_v_after_softmax
v=$'    v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0).to(q.dtype)\n'
k=$'    k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0).to(q.dtype)\n'
rewrite raygrid/kernels/triton_attention.py "$v" ""
rewrite raygrid/kernels/triton_attention.py "$k" "$k$v"
export RAYGRID_GIT_COMMIT="${RAYGRID_GIT_COMMIT:-}+v_with_k"
side B_v_with_k
