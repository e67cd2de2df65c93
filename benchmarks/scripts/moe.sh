#!/usr/bin/env bash
# The MoE runs of benchmarks/README.md (issue #13), on one GPU:
#   benchmarks/scripts/moe.sh OUT kernel   # kernel tests at real sizes, then the kernel against its reference and a tile sweep
#   benchmarks/scripts/moe.sh OUT model    # random-qwen3-30b-a3b on W1 (+ decode profile vs memory floor), graphs vs eager,
#                                          # and transformers against raygrid on a 4-layer slice written as a real checkpoint
# Each run writes OUT/<name>.json and OUT/<name>.log.
set -u
out=$1
what=${2:-kernel}
mkdir -p "$out"
. "$(dirname "$0")/runs.sh"
w1=("${w1[@]}" --num-prompts 256)
case $what in
  kernel)
    python3 -m pytest -q tests/test_kernels.py -k "moe or align" 2>&1 | tail -3
    python3 benchmarks/scripts/moe_kernel.py "$out/moe_kernel.json" --tokens 1 16 64 256 1024 8192 2>&1 | tee "$out/moe_kernel.log" | grep -v "^   skip"
    ;;
  model)
    run w1_qwen3_30b_a3b bench throughput --model random-qwen3-30b-a3b "${w1[@]}" --profile-dir "$out"
    run graphs_vs_eager_qwen3_30b_a3b bench parallel --model random-qwen3-30b-a3b --dtype bfloat16 --layouts 1x1 1x1:eager \
      --num-prompts 16 --input-len 256 --max-tokens 32
    slice=${SLICE_DIR:-/tmp/qwen3-30b-a3b-4-layers}
    python3 benchmarks/scripts/write_moe_slice.py "$slice"
    run w1_slice4_raygrid bench throughput --model "$slice" "${w1[@]}"
    run w1_slice4_hf bench throughput --model "$slice" "${w1[@]}" --backend hf
    ;;
esac
