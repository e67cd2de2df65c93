#!/usr/bin/env bash
# One H200 (2026-12-04), first command: the kernel and engine tests of FP8 products scaled by the kernel that reads
# them (ops.Fp8Product), then W1 on random-llama3-8b with FP8 weights and KV cache, with it (default) and without
# (RAYGRID_FP8_DEFER_SCALE=0). Results packed in one tar (the device returns 8 files at most).
#   bash benchmarks/results/fp8_defer_h200/1_dde2e8b/device_command.sh "$OUT"
cd "$(dirname "$0")/../../../.."
OUTDIR=$1; R=$OUTDIR/r; mkdir -p "$R"
python3 -c "import msgspec, zmq, llguidance" || exit 3
timeout 100 python3 -m pytest -q tests/test_kernels.py -k "fp8 or rms_norm or silu or rotary" > "$R/kernel_tests.txt" 2>&1; tail -2 "$R/kernel_tests.txt"
timeout 150 python3 -m pytest -q tests/test_gpu.py -k "fp8" > "$R/gpu_tests.txt" 2>&1; tail -2 "$R/gpu_tests.txt"
w=(--model random-llama3-8b --dtype bfloat16 --random-range 100 1024 --no-progress --num-prompts 256 --quantization fp8 --kv-cache-dtype fp8)
one() { name=$1; lim=$2; shift 2; timeout "$lim" bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput $*"; }
one w1_8b_fp8_defer_1 175 "${w[*]}"
(export RAYGRID_FP8_DEFER_SCALE=0; one w1_8b_fp8_own_launch_1 85 "${w[*]}")
tar -C "$R" -czf "$OUTDIR/results.tgz" .
true
