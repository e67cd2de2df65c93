#!/usr/bin/env bash
# One H200 (2026-12-04), seventh command: W1 on random-llama3-8b with FP8 weights and cache, gate_up_proj's product
# scaled by its own launch (the tree) against scaled inside SiLU-and-mul (the tree rewritten in place, then restored),
# and bf16; then the tree's W1 steps profiled (profile_w1_prompts.py). Packed in one tar.
#   bash benchmarks/results/fp8_defer_h200/7_gate_up_*/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
. benchmarks/scripts/runs.sh
w=(--model random-llama3-8b --dtype bfloat16 --random-range 100 1024 --no-progress --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout "$lim" bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
own='gate_up = self.gate_up_proj(x)'
fused='gate_up = self.gate_up_proj(x, defer_scale=True)'
one w1_8b_fp8_gate_up_own_1 175 "${w[*]}" "${f[*]}"
rewrite raygrid/models/llama.py "$own" "$fused" && one w1_8b_fp8_gate_up_fused_1 85 "${w[*]}" "${f[*]}"
rewrite raygrid/models/llama.py "$fused" "$own" && one w1_8b_fp8_gate_up_own_2 85 "${w[*]}" "${f[*]}"
one w1_8b_bf16_1 90 "${w[*]}"
tar -C "$R" -czf "$OUTDIR/results.tgz" .  # again at the end, with the profile
timeout 75 python3 benchmarks/scripts/profile_w1_prompts.py "$R/prompts_8b_fp8.json" --model random-llama3-8b --quantization fp8 \
  --kv-cache-dtype fp8 > "$R/prompts_8b_fp8.log" 2>&1; echo "profile exit $?"
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
