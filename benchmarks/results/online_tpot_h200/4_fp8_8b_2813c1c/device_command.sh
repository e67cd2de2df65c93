#!/usr/bin/env bash
# One H200 (2026-12-03, eighth session), third command: W1 on random-llama3-8b at HEAD, FP8 weights and KV cache
# (twice; the first run also builds the checkpoint and compiles) against bf16: #21's FP8 ratio on the final tree.
cd "$(dirname "$0")/../../../.."
R=$OUT/r; mkdir -p $R
. benchmarks/scripts/runs.sh
w=("${w1[@]}" --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout $lim bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
one w1_8b_fp8_1 170 --model random-llama3-8b ${w[*]} ${f[*]}
one w1_8b_bf16 90 --model random-llama3-8b ${w[*]}
one w1_8b_fp8_2 70 --model random-llama3-8b ${w[*]} ${f[*]}
true
