#!/usr/bin/env bash
# The mixed launch (decode rows apart, prompts beside them on a second stream): GPU tests, then A (ce2071a, one launch)
# against B (this tree) offline on the mixed step and W1, then #11's online latency on B.
cd "$(dirname "$0")/.."
R=$OUT/r
out=$R
. benchmarks/scripts/runs.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py -k "mixed_batch or decode or prefill" > $R/kernel_tests.txt 2>&1; echo "kernel tests $?"; tail -2 $R/kernel_tests.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py > $R/gpu_tests.txt 2>&1; echo "gpu tests $?"; tail -3 $R/gpu_tests.txt
B=$PYTHONPATH
for side in A B; do
  if [ $side = A ]; then export PYTHONPATH=/tmp/site:$PWD/.device/A; else export PYTHONPATH=$B; fi
  timeout 150 python3 benchmarks/scripts/mixed_step.py $R/mixed_$side.json > $R/mixed_$side.log 2>&1; echo "mixed $side $?"; grep -v "^  " $R/mixed_$side.log | tail -4
  run w1_$side bench throughput --model random-qwen3-0.6b "${w1[@]}" --num-prompts 256
done
export PYTHONPATH=$B
mkdir -p $R/online_latency
API_SERVERS=2 CLIENTS=4 timeout 240 bash benchmarks/scripts/online_latency.sh $R/online_latency 2>&1 | tail -12
true
