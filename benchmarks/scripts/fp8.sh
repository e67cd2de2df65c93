#!/usr/bin/env bash
# The FP8 runs of benchmarks/README.md (issue #21), on one GPU:
#   benchmarks/scripts/fp8.sh OUT tests     # the FP8 kernel and model tests on the GPU
#   benchmarks/scripts/fp8.sh OUT w1        # W1 on random-llama3-8b in bf16, with --quantization fp8, and with an FP8
#                                           # KV cache too
#   benchmarks/scripts/fp8.sh OUT accuracy  # prompt logprobs and greedy tokens of fp8 and bf16 against float32
# Each run writes OUT/<name>.json and OUT/<name>.log.
set -u
out=$1
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
w1=("${w1[@]}" --num-prompts 256)
for what in "${@:2}"; do
  case $what in
    tests)
      python3 -m pytest -q tests/test_fp8.py tests/test_kernels.py -k "fp8 or linear or per_token or attention or store_kv" 2>&1 \
        | tail -5 | tee "$out/gpu_tests.txt"
      ;;
    w1)
      run w1_llama3_8b_bf16 bench throughput --model random-llama3-8b "${w1[@]}"
      run w1_llama3_8b_fp8 bench throughput --model random-llama3-8b "${w1[@]}" --quantization fp8
      run w1_llama3_8b_fp8_kv bench throughput --model random-llama3-8b "${w1[@]}" --quantization fp8 --kv-cache-dtype fp8
      ;;
    accuracy)
      python3 benchmarks/scripts/fp8_accuracy.py "$out/fp8_accuracy.json" 2>&1 | tail -3
      ;;
  esac
done
