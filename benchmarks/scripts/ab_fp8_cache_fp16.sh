#!/usr/bin/env bash
# A/B in one device command: attention over the FP8 KV cache computing in float16 (C, the tree as it is: bf16
# queries become float16 and the cache converts to float16) against computing in the query's bf16 (A, the tree
# rewritten in place by this script). Each side: the decode kernel sweep over the FP8 cache, and W1 on
# random-llama3-8b with FP8 weights and the FP8 cache.
#   bash benchmarks/scripts/ab_fp8_cache_fp16.sh OUT
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
side() {
  python3 benchmarks/scripts/sweep_decode_kv_dtype.py --kv-dtypes fp8 --label "$1" --output-json "$out/decode_fp8_$1.json" > "$out/decode_fp8_$1.log" 2>&1
  run "w1_llama3_8b_fp8_kv_$1" bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 --quantization fp8 --kv-cache-dtype fp8
}
side C_fp16
python3 - <<'PY'
p = "raygrid/kernels/triton_attention.py"
s = open(p).read()
line = "    q = _fp16_for_fp8_cache(q, k_cache_ptr)\n"
assert s.count(line) == 2
open(p, "w").write(s.replace(line, ""))
PY
export RAYGRID_GIT_COMMIT="${RAYGRID_GIT_COMMIT:-}-fp16"
side A_bf16
