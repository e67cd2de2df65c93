#!/usr/bin/env bash
# One H200 (2026-12-04, same session), fifth command: the GPU tests and the bad-input tests at 5156002 (after the
# one-line InvalidArgument errors, the priority check and LLM.chat's shape check). Ray is not carried.
cd "$(dirname "$0")/../../../.."
mkdir -p $OUT/r
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_bad_input.py > $OUT/r/gpu_tests.txt 2>&1
