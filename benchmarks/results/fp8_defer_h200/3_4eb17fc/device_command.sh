#!/usr/bin/env bash
# One H200 (2026-12-04), third command, at 4eb17fc: W1 on random-llama3-8b, bf16 and FP8 weights and cache alternating
# (twice each), then FP8 with every product scaled by a launch of its own (RAYGRID_FP8_DEFER_SCALE=0). Packed in one tar.
#   bash benchmarks/results/fp8_defer_h200/3_4eb17fc/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
w=(--model random-llama3-8b --dtype bfloat16 --random-range 100 1024 --no-progress --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout "$lim" bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
one w1_8b_bf16_1 175 "${w[*]}"
one w1_8b_fp8_1 175 "${w[*]}" "${f[*]}"
one w1_8b_bf16_2 90 "${w[*]}"
one w1_8b_fp8_2 85 "${w[*]}" "${f[*]}"
(export RAYGRID_FP8_DEFER_SCALE=0; one w1_8b_fp8_own_launch 85 "${w[*]}" "${f[*]}")
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
