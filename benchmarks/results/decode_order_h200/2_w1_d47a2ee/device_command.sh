#!/usr/bin/env bash
# W1 on random-llama3-8b: FP8 weights and KV cache by default (A), with kv heads fastest + longest first (H), and H
# with the narrow FP8 launch from 10 programs an SM (HN); bf16 A and H for the ratio; then random-qwen3-0.6b A / H.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
w=("${w1[@]}" --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
H='{"heads_fastest": true, "longest_first": true}'
HN='{"heads_fastest": true, "longest_first": true, "fp8_narrow_from": 10}'
one() { name=$1; cfg=$2; lim=$3; shift 3; RAYGRID_DECODE_CONFIG="$cfg" timeout $lim bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
one w1_8b_fp8_H "$H" 150 --model random-llama3-8b ${w[*]} ${f[*]}
one w1_8b_fp8_A '{}' 100 --model random-llama3-8b ${w[*]} ${f[*]}
one w1_8b_fp8_HN "$HN" 100 --model random-llama3-8b ${w[*]} ${f[*]}
one w1_8b_bf16_A '{}' 100 --model random-llama3-8b ${w[*]}
one w1_8b_bf16_H "$H" 100 --model random-llama3-8b ${w[*]}
one w1_A_1 '{}' 60 --model random-qwen3-0.6b ${w[*]}
one w1_H_1 "$H" 60 --model random-qwen3-0.6b ${w[*]}
true
