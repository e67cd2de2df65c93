#!/usr/bin/env bash
# One H200 (2026-12-04), second command: the FP8 cache's decode tests; the decode launches over an FP8 cache at batch
# sizes between W1's phases (8B heads, longest first), to place fp8_medium_from; then W1 on random-llama3-8b: FP8
# weights and cache as the tree runs them (deferred scales, the 64-key two-warp launch), bf16, FP8 without the
# two-warp launch, FP8 again. Results packed in one tar.
#   bash benchmarks/results/fp8_defer_h200/2_ec422b8/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
timeout 60 python3 -m pytest -q tests/test_kernels.py -k "fp8_kv_cache or decode" > "$R/kernel_tests.txt" 2>&1; tail -1 "$R/kernel_tests.txt"
timeout 80 python3 benchmarks/scripts/sweep_decode_attention.py --order --order-launches 128x4x2,64x2x2,32x1x2 --order-kv-dtype fp8 \
  --order-heads 32 --order-seqs 80,96,112,128,144,160,176 --order-variants "longest first" --output-json "$R/launches.json" > "$R/launches.log" 2>&1
grep -v "^ " "$R/launches.log" | tail -3; grep -c us "$R/launches.log"
w=(--model random-llama3-8b --dtype bfloat16 --random-range 100 1024 --no-progress --num-prompts 256)
f=(--quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout "$lim" bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
one w1_8b_fp8_1 175 "${w[*]}" "${f[*]}"
one w1_8b_bf16_1 90 "${w[*]}"
(export RAYGRID_DECODE_CONFIG='{"fp8_medium_from": 0}'; one w1_8b_fp8_no_medium_1 85 "${w[*]}" "${f[*]}")
one w1_8b_fp8_2 85 "${w[*]}" "${f[*]}"
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
