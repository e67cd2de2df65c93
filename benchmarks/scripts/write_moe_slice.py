"""Write a slice of Qwen3-30B-A3B's shape (random bf16 weights, first N layers) as a real checkpoint, made on the GPU.

    python3 benchmarks/scripts/write_moe_slice.py OUT_DIR [--layers 4] [--skew-experts 8 16]

``--skew-experts A B`` biases every router toward experts A..B-1: a constant direction v goes into every
embedding (the residual stream carries it into each MoE layer) and those experts' router rows point along v,
so their logits dwarf the others' and every token picks them (the EPLB runs of benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from raygrid.models.default_model import build_tokenizer, qwen3_30b_a3b_config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--skew-experts", type=int, nargs=2, default=None, metavar=("FIRST", "END"))
    args = parser.parse_args()
    start = time.time()
    tokenizer = build_tokenizer(vocab_size=151936)
    config = qwen3_30b_a3b_config(tokenizer)
    config.num_hidden_layers = args.layers
    with torch.device("cuda"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if args.skew_experts:
        first, end = args.skew_experts
        with torch.no_grad():
            v = torch.ones(config.hidden_size, device="cuda") / config.hidden_size**0.5
            model.model.embed_tokens.weight += (10.0 * v).to(torch.bfloat16)
            for layer in model.model.layers:
                layer.mlp.gate.weight[first:end] += (100.0 * v).to(torch.bfloat16)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote the {args.layers}-layer slice{' (skewed)' if args.skew_experts else ''} to {args.out} in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
