#!/usr/bin/env bash
# One H200 (2026-12-04), fifth command: the kernel tests of prefill and FP8 again, after the fix for launches given
# 16-row tiles (the fourth command's 10 failures: the chosen launch's subtiles applied to them).
cd "$(dirname "$0")/../../../.."
R=$1; mkdir -p "$R"
timeout 170 python3 -m pytest -q tests/test_kernels.py tests/test_fp8.py -k "prefill or fp8" > "$R/kernel_tests.txt" 2>&1; tail -2 "$R/kernel_tests.txt"
