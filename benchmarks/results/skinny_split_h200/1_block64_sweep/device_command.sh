#!/usr/bin/env bash
# Block 64 as the GPU default: GPU tests in full, W1 at 16 vs 64 (alternating). Skinny linear split-K: GPU kernel
# tests and the chained sweep.
cd "$(dirname "$0")/.."
R=$OUT/r
. benchmarks/scripts/runs.sh
out=$R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 50 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "skinny" > $R/skinny_tests.txt 2>&1; echo "skinny tests $?"; tail -3 $R/skinny_tests.txt
timeout 170 python3 benchmarks/scripts/sweep_skinny_linear.py --budget-s 120 --output-json $R/sweep_skinny.json > $R/sweep_skinny.log 2>&1; echo "sweep $?"; cat $R/sweep_skinny.log | tail -14
timeout 175 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; grep -E "passed|failed|^FAILED|^ERROR" $R/gpu_tests.txt | tail -8
for name in w1_b64_1 w1_b16_1 w1_b64_2 w1_b16_2; do
  bs=${name:4:2}
  timeout 55 bash -c ". benchmarks/scripts/runs.sh; out=$R; run $name bench throughput --model random-qwen3-0.6b ${w1[*]} --block-size $bs"
done
true
