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
    python3 - "$slice" <<'PY'
import sys, time, torch
from transformers import AutoModelForCausalLM
from raygrid.models.default_model import build_tokenizer, qwen3_30b_a3b_config
start = time.time()
tokenizer = build_tokenizer(vocab_size=151936)
config = qwen3_30b_a3b_config(tokenizer)
config.num_hidden_layers = 4
with torch.device("cuda"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
# A constant direction v in every embedding, carried by the residual stream into each MoE layer, and the
# routers' rows of experts 8-15 along it: their logits dwarf the others', so every token picks them.
with torch.no_grad():
    v = torch.ones(config.hidden_size, device="cuda") / config.hidden_size**0.5
    model.model.embed_tokens.weight += (10.0 * v).to(torch.bfloat16)
    for layer in model.model.layers:
        layer.mlp.gate.weight[8:16] += (100.0 * v).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
print(f"wrote the skewed 4-layer slice to {sys.argv[1]} in {time.time() - start:.0f} s", flush=True)
PY
    run skew_ep2 bench throughput --model "$slice" "${w1[@]}" -dp 2 --enable-expert-parallel
    run skew_ep2_eplb bench throughput --model "$slice" "${w1[@]}" -dp 2 --enable-expert-parallel --enable-eplb \
      --eplb-config '{"num_redundant_experts": 8, "window_size": 100, "step_interval": 100}'
    ;;
esac
