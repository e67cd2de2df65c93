# one H200, 2026-12-03, tree 0689fc6 (the command's prefix sets RAYGRID_GIT_COMMIT=0689fc6)
#!/usr/bin/env bash
# The final tree's GPU tests: tests/test_gpu.py, then the attention kernel tests the time leaves.
cd "$(dirname "$0")/.."
R=$OUT/r
timeout 160 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "decode_attention or padded_batch or short_tiles" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
true
