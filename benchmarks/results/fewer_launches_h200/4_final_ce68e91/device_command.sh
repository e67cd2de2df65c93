#!/usr/bin/env bash
# The final tree: the GPU suite and every kernel test.
cd "$(dirname "$0")/.."
R=$OUT/r
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -3 $R/kernel_tests.txt
true
