"""What the products of a decode step at 32 to 256 rows would gain with their weights already in L2: cuBLAS (the
engine's ``F.linear`` in bf16) over Qwen3-0.6B's four weight shapes, a chain of 28 launches over 28 weights (each read
from DRAM, as a step's layers read theirs) against 28 launches over one weight (in L2 after the first), us a launch,
in one CUDA graph (``kernel_timing.chain_us``), twice. An upper bound for reading the weights into L2 ahead of their
products (``skinny_l2_chains.py`` is the same for the skinny kernel at one row).

    python benchmarks/scripts/cublas_l2_chains.py OUT.json [--rows 32 64 128 256]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.throughput import provenance

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # (N, K)
LAYERS = 28


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_json")
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 64, 128, 256])
    args = parser.parse_args()
    device = torch.device("cuda")
    weights = {name: [torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
               for name, (n, k) in SHAPES.items()}
    rows = []
    with torch.inference_mode():
        for m in args.rows:
            row = dict(rows=m)
            for name, (n, k) in SHAPES.items():
                x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                outs = [torch.empty(m, n, device=device, dtype=torch.bfloat16) for _ in range(LAYERS)]
                cold = [lambda w=w, o=o: torch.mm(x, w.t(), out=o) for w, o in zip(weights[name], outs)]
                hot = [lambda o=o: torch.mm(x, weights[name][0].t(), out=o) for o in outs]
                row[name] = dict(dram_us=[chain_us(cold, 20) for _ in range(2)], l2_us=[chain_us(hot, 20) for _ in range(2)])
            row["layer_dram_us"] = sum(min(row[s]["dram_us"]) for s in SHAPES)
            row["layer_l2_us"] = sum(min(row[s]["l2_us"]) for s in SHAPES)
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(args.output_json).write_text(json.dumps(dict(provenance(), torch=torch.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
