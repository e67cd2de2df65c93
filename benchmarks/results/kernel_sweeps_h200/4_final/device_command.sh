#!/usr/bin/env bash
# One H200 (2026-12-04), fourth command, on the tree with both new defaults (prefill tiles in halves, FP8 fast
# accumulation): the GPU test suite and the kernel tests of prefill and FP8; then FP8 accuracy against float32
# without fast accumulation (RAYGRID_FP8_FAST_ACCUM=0) and with it. Results packed in one tar.
#   bash benchmarks/results/kernel_sweeps_h200/4_final/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
timeout 200 python3 -m pytest -q tests/test_gpu.py > "$R/gpu_tests.txt" 2>&1; tail -2 "$R/gpu_tests.txt"
timeout 170 python3 -m pytest -q tests/test_kernels.py tests/test_fp8.py -k "prefill or fp8" > "$R/kernel_tests.txt" 2>&1; tail -2 "$R/kernel_tests.txt"
RAYGRID_FP8_FAST_ACCUM=0 timeout 110 python3 benchmarks/scripts/fp8_accuracy.py "$R/accuracy_plain.json" --variants fp8,fp8_and_fp8_kv_cache > "$R/accuracy_plain.log" 2>&1; tail -2 "$R/accuracy_plain.log" | cut -c1-200
timeout 80 python3 benchmarks/scripts/fp8_accuracy.py "$R/accuracy_fast.json" --variants fp8,fp8_and_fp8_kv_cache > "$R/accuracy_fast.log" 2>&1; tail -2 "$R/accuracy_fast.log" | cut -c1-200
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
