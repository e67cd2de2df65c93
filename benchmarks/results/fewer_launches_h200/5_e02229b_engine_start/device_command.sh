#!/usr/bin/env bash
# The tree after memory_profile.py (e02229b): an engine start on the H200 (memory profile, CUDA graphs) and one latency run.
. benchmarks/scripts/runs.sh; out=$OUT/r
run lat_final bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 --output-len 32 --num-iters 1
