#!/usr/bin/env bash
# The tree with decode programs longest first (and the FP8 narrow launch for full batches): GPU tests, the attention
# kernel tests, then W1 on random-qwen3-0.6b against 7a1dde2 (A) alternating, two rounds.
cd "$(dirname "$0")/.."
R=$OUT/r
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode or fp8_kv or padded_batch" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
A_COMMIT=7a1dde2 timeout 220 bash benchmarks/scripts/ab_w1.sh $R/ab .device/base7a1 2 --model random-qwen3-0.6b --num-prompts 256
true
