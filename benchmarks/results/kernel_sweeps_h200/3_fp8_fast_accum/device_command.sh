#!/usr/bin/env bash
# One H200 (2026-12-04), third command: FP8 products with fast accumulation (RAYGRID_FP8_FAST_ACCUM=1) against
# without, W1 on random-llama3-8b with FP8 weights and KV cache, alternating, beside bf16; then the accuracy of each
# against float32 on random-qwen3-0.6b. Results are packed in one tar (the device returns 8 files at most).
#   bash benchmarks/results/kernel_sweeps_h200/3_fp8_fast_accum/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
w=(--model random-llama3-8b --dtype bfloat16 --random-range 100 1024 --no-progress --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout "$lim" bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
(export RAYGRID_FP8_FAST_ACCUM=1; one w1_8b_fp8_fast_1 170 "${w[*]}" "${f[*]}")
one w1_8b_fp8_1 80 "${w[*]}" "${f[*]}"
one w1_8b_bf16 90 "${w[*]}"
(export RAYGRID_FP8_FAST_ACCUM=1; one w1_8b_fp8_fast_2 80 "${w[*]}" "${f[*]}")
one w1_8b_fp8_2 80 "${w[*]}" "${f[*]}"
timeout 70 python3 benchmarks/scripts/fp8_accuracy.py "$R/accuracy.json" --variants fp8,fp8_and_fp8_kv_cache > "$R/accuracy.log" 2>&1; tail -2 "$R/accuracy.log" | cut -c1-300
RAYGRID_FP8_FAST_ACCUM=1 timeout 70 python3 benchmarks/scripts/fp8_accuracy.py "$R/accuracy_fast.json" --variants fp8,fp8_and_fp8_kv_cache > "$R/accuracy_fast.log" 2>&1; tail -2 "$R/accuracy_fast.log" | cut -c1-300
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
