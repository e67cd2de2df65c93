#!/usr/bin/env bash
# The expert-parallel runs of benchmarks/README.md (issue #14), on a machine with two GPUs:
#   benchmarks/scripts/eplb.sh OUT ep     # random-qwen3-30b-a3b on W1: one GPU, then EP=2 (DP=2 attention) on two
#   benchmarks/scripts/eplb.sh OUT ep1    # the same on one GPU, then the expert-parallel path with EPLB on one rank
#   benchmarks/scripts/eplb.sh OUT skew   # a 4-layer slice of it whose routers send every token to experts 8-15,
#                                         # all on EP rank 0 at first: EP=2 without EPLB, then with it (8 redundant slots)
# Each run writes OUT/<name>.json and OUT/<name>.log.
set -u
out=$1
what=${2:-ep}
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
w1=("${w1[@]}" --num-prompts 256)
case $what in
  ep1)  # one GPU: the plain engine, then the expert-parallel path on an EP group of one with EPLB (its overhead)
    run w1_qwen3_30b_a3b_1gpu bench throughput --model random-qwen3-30b-a3b "${w1[@]}"
    run w1_qwen3_30b_a3b_ep1_eplb bench throughput --model random-qwen3-30b-a3b "${w1[@]}" --enable-expert-parallel --enable-eplb \
      --eplb-config '{"num_redundant_experts": 16, "window_size": 100, "step_interval": 100}'
    ;;
  ep)
    run w1_qwen3_30b_a3b_1gpu bench throughput --model random-qwen3-30b-a3b "${w1[@]}"
    run w1_qwen3_30b_a3b_ep2 bench throughput --model random-qwen3-30b-a3b "${w1[@]}" -dp 2 --enable-expert-parallel
    ;;
  skew)
    slice=${SLICE_DIR:-/tmp/qwen3-30b-a3b-4-layers-skewed}
    python3 benchmarks/scripts/write_moe_slice.py "$slice" --skew-experts 8 16
    run skew_ep2 bench throughput --model "$slice" "${w1[@]}" -dp 2 --enable-expert-parallel
    run skew_ep2_eplb bench throughput --model "$slice" "${w1[@]}" -dp 2 --enable-expert-parallel --enable-eplb \
      --eplb-config '{"num_redundant_experts": 8, "window_size": 100, "step_interval": 100}'
    ;;
esac
