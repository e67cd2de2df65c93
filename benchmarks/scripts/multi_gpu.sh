#!/usr/bin/env bash
# The multi-GPU runs of benchmarks/README.md, on one machine with 2 or more GPUs:
#   benchmarks/scripts/multi_gpu.sh OUT check       # layouts against TP=1 (tokens, first logprobs), graphs vs eager
#   benchmarks/scripts/multi_gpu.sh OUT throughput  # random-llama3-8b on W1: TP=1, TP=2, PP=2, and DP=2 on 512 requests
#   benchmarks/scripts/multi_gpu.sh OUT allreduce   # the custom all-reduce against NCCL and torch's kernels (4 KiB to
#                                                   # 64 MiB, eager and in CUDA graphs), then W1 on the 8B at TP=1, TP=2
#                                                   # and TP=2 with the custom all-reduce, in one command
#   benchmarks/scripts/multi_gpu.sh OUT all         # both, the 0.6B check and the 8B throughput first
# Each run writes OUT/<name>.json and OUT/<name>.log.
set -u
out=$1
what=${2:-check}
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
case $what in
  check)
    run parallel_qwen3_0.6b bench parallel --model random-qwen3-0.6b --dtype bfloat16 --layouts 1x1 2x1 2x1:eager 1x2 \
      --num-prompts 64 --input-len 512 --max-tokens 64
    run parallel_llama3_8b bench parallel --model random-llama3-8b --dtype bfloat16 --layouts 1x1 2x1 1x2 \
      --num-prompts 32 --input-len 512 --max-tokens 32
    ;;
  throughput)
    run w1_llama3_8b_tp1 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256
    run w1_llama3_8b_tp2 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 -tp 2
    run w1_llama3_8b_dp2_512 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 512 -dp 2
    run w1_llama3_8b_tp1_512 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 512
    run w1_llama3_8b_pp2 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 -pp 2
    ;;
  allreduce)
    python3 -m pytest -q tests/test_gpu_all_reduce.py 2>&1 | tail -3 | tee "$out/gpu_allreduce_tests.txt"
    run allreduce bench allreduce
    run w1_llama3_8b_tp1 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256
    run w1_llama3_8b_tp2 bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 -tp 2
    run w1_llama3_8b_tp2_custom bench throughput --model random-llama3-8b "${w1[@]}" --num-prompts 256 -tp 2 --custom-all-reduce
    ;;
  all)
    "$0" "$out" check-small
    "$0" "$out" throughput
    "$0" "$out" check-8b
    ;;
  check-small)
    run parallel_qwen3_0.6b bench parallel --model random-qwen3-0.6b --dtype bfloat16 --layouts 1x1 2x1 2x1:eager 1x2 \
      --num-prompts 64 --input-len 512 --max-tokens 64
    ;;
  check-8b)
    run parallel_llama3_8b bench parallel --model random-llama3-8b --dtype bfloat16 --layouts 1x1 2x1 1x2 \
      --num-prompts 32 --input-len 512 --max-tokens 32
    ;;
esac
