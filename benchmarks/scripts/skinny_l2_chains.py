"""The skinny linear kernel at one row, Qwen3-0.6B's four weight shapes: a chain of 28 launches over 28 weights (each
read from DRAM, as a decode step's layers read theirs) against 28 launches over one weight (in L2 after the first),
us a launch, in one CUDA graph with PDL (``kernel_timing.chain_us``), twice. The gap is what weights already in L2
would save a batch-1 step; benchmarks/README.md ("The prompt kernel without its softmax") has the numbers.

    python benchmarks/scripts/skinny_l2_chains.py --output-json OUT.json
"""

from __future__ import annotations

import argparse
import json

import torch

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_linear import skinny_linear

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # (N, K)
LAYERS = 28


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    results = {}
    for _ in range(2):
        for name, (n, k) in SHAPES.items():
            weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(LAYERS)]
            x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
            cold = chain_us([lambda w=w: skinny_linear(x, w) for w in weights])
            warm = chain_us([lambda: skinny_linear(x, weights[0]) for _ in weights])
            results.setdefault(name, []).append({"dram_us": round(cold, 2), "l2_us": round(warm, 2)})
            print(f"{name} [{n}, {k}]: {cold:.2f} us from DRAM, {warm:.2f} us from L2", flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
