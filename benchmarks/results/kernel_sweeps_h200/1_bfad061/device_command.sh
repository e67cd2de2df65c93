#!/usr/bin/env bash
# One device command on one H200 (2026-12-04), at bfad061: the prefill kernel's launches (query tiles in two halves,
# pipeline stages, tile shapes; registers and shared memory recorded), long contexts' decode slices by bulk copy, FP8
# products with cuBLASLt's fast accumulation; the prefill kernel tests first.
#   bash benchmarks/results/kernel_sweeps_h200/1_bfad061/device_command.sh "$OUT"
set -u
OUT=$1
python3 -c "import msgspec, zmq, llguidance" || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt"
timeout 180 python3 -m pytest -q tests/test_kernels.py -k prefill > "$OUT/kernel_tests.txt" 2>&1; tail -2 "$OUT/kernel_tests.txt"
timeout 300 python3 benchmarks/scripts/sweep_prefill_attention.py --cases 1x8192,1x32768,8x8192,1x8192@24576 --page 64 \
  --output-json "$OUT/prefill.json" \
  --config '{}' --config '{"num_stages": 2}' --config '{"subtiles": 2}' --config '{"subtiles": 2, "num_stages": 2}' \
  --config '{"subtiles": 2, "num_stages": 4}' --config '{"block_n": 32, "num_stages": 3}' --config '{"block_n": 32, "num_stages": 4}' \
  --config '{"block_m": 64, "num_stages": 2}' --config '{"block_m": 64, "num_stages": 3}' --config '{"block_m": 64, "num_stages": 4}' \
  --config '{"num_warps": 8, "subtiles": 2}' --config '{"block_m": 256, "num_warps": 8, "subtiles": 2}' \
  --config '{"block_n": 128, "num_warps": 8, "num_stages": 2, "subtiles": 2}' > "$OUT/prefill.log" 2>&1
grep -E "x [0-9]+ @" "$OUT/prefill.log" | cut -c1-400
timeout 200 python3 benchmarks/scripts/sweep_decode_attention.py --long-bulk --output-json "$OUT/decode_long.json" > "$OUT/decode_long.log" 2>&1
tail -2 "$OUT/decode_long.log" | cut -c1-600
timeout 150 python3 benchmarks/scripts/sweep_fp8_linear.py --rows 16 128 256 2048 8192 --output-json "$OUT/fp8_linear.json" > "$OUT/fp8_linear.log" 2>&1
tail -1 "$OUT/fp8_linear.log" | cut -c1-300
