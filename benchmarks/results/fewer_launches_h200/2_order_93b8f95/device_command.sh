#!/usr/bin/env bash
# Unequal contexts in the batch's order or longest first (sweep --order); the skinny split-K barrier: its kernel
# tests and a latency run against the tree before (.device/A, 091e17e).
cd "$(dirname "$0")/.."
R=$OUT/r; out=$R
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 100 python3 benchmarks/scripts/sweep_decode_attention.py --order --output-json $R/sweep_decode_order.json > $R/sweep_decode_order.txt 2>&1; echo "order sweep $?"; grep -v Warn $R/sweep_decode_order.txt | tail -5
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "skinny" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
L="bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 32768 --output-len 128 --num-iters 3"
lat() { name=$1; tree=$2; shift 2; (export PYTHONPATH=/tmp/site:$tree; [ "$tree" != "$PWD" ] && export RAYGRID_GIT_COMMIT=091e17e; timeout 75 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name $L $*"); }
lat lat_A1 $PWD/.device/A
lat lat_H1 $PWD
true
