"""Times the engine's linear layers above the skinny kernel's rows (cuBLAS through ``torch.nn.functional.linear``)
under PyTorch's two GEMM paths on CUDA, at Qwen3-0.6B's shapes, bf16:

- ``cublas``: PyTorch's default, cuBLAS with its own choice of kernel;
- ``cublaslt``: ``torch.backends.cuda.preferred_blas_library("cublaslt")`` (what ``TORCH_BLAS_PREFER_CUBLASLT=1``
  sets), cuBLASLt's first heuristic.

At W1's decode batches (about 200 rows) cuBLAS takes about 29 us a layer where the weights' read is 7.5 us and the
products' compute about 11 (benchmarks/README.md): o_proj's [256, 1024] output is 16 tiles of 128 x 128 for 132 SMs.
Which kernel cuBLASLt's heuristic picks there is what this measures. (TunableOp, ``torch.cuda.tunable``, would try
more kernels, but on CUDA it registers only PyTorch's default GEMM: its other candidates are ROCm's.)

For each row count, a decode step's linear layers are chained as the engine runs them (qkv, o, gate_up, down for 28
layers, each layer its own weights, so none comes from L2) in one CUDA graph, replayed and timed with CUDA events
(``kernel_timing.chain_us``); the figure is per layer. The LM head (one [151936, 1024] weight, larger than L2) is
timed alone, 8 launches a graph. The backends alternate, two rounds, and each result is compared with cuBLAS's.

    python benchmarks/scripts/sweep_blas_backends.py OUT.json [--rows 1 64 128 256 8192]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.throughput import provenance

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # Qwen3-0.6B (N, K)
LM_HEAD = (151936, 1024)
LAYERS = 28
BACKENDS = ("cublas", "cublaslt")


def use_backend(name: str) -> None:
    torch.backends.cuda.preferred_blas_library(name)


def time_rows(m: int, layers: list[dict], lm_head: torch.Tensor) -> dict:
    """Microseconds a layer (the four products chained), each product alone (28 of it chained) and the LM head at
    ``m`` rows, with the current backend."""
    inputs = {name: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for name, (n, k) in SHAPES.items()}
    calls = [lambda name=name, layer=layer: F.linear(inputs[name], layer[name]) for layer in layers for name in SHAPES]
    per_layer = chain_us(calls) * len(SHAPES)
    each = {name: round(chain_us([lambda layer=layer: F.linear(inputs[name], layer[name]) for layer in layers]), 2)
            for name in SHAPES}
    head_x = torch.randn(m, LM_HEAD[1], dtype=torch.bfloat16, device="cuda")
    head_us = chain_us([lambda: F.linear(head_x, lm_head)] * 8)
    return {"us_per_layer": round(per_layer, 2), "us_each": each, "lm_head_us": round(head_us, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_json")
    parser.add_argument("--rows", type=int, nargs="+", default=[17, 32, 64, 128, 192, 256, 512, 2048, 8192])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    layers = [{name: torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for name, (n, k) in SHAPES.items()}
              for _ in range(LAYERS)]
    lm_head = torch.randn(*LM_HEAD, dtype=torch.bfloat16, device="cuda") / LM_HEAD[1] ** 0.5
    result = {**provenance(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": LAYERS,
              "shapes": SHAPES, "rows": []}
    for m in args.rows:
        x = {name: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for name, (n, k) in SHAPES.items()}
        row = {"m": m, "runs": {backend: [] for backend in BACKENDS}, "max_abs_diff": {}}
        for _ in range(args.rounds):
            for backend in BACKENDS:
                use_backend(backend)
                outs = {name: F.linear(x[name], layers[0][name]).float() for name in SHAPES}
                if backend == "cublas":
                    reference = outs
                else:
                    row["max_abs_diff"][backend] = max((outs[n] - reference[n]).abs().max().item() for n in SHAPES)
                row["runs"][backend].append(time_rows(m, layers, lm_head))
        use_backend("cublas")
        best = {b: min(r["us_per_layer"] for r in runs) for b, runs in row["runs"].items()}
        head = {b: min(r["lm_head_us"] for r in runs) for b, runs in row["runs"].items()}
        row["best_us_each"] = {b: {n: min(r["us_each"][n] for r in runs) for n in SHAPES} for b, runs in row["runs"].items()}
        row["best_us_per_layer"], row["best_lm_head_us"] = best, head
        result["rows"].append(row)
        print(f"M={m:5d}  us a layer: " + "  ".join(f"{b} {best[b]:8.2f}" for b in BACKENDS)
              + "   LM head: " + "  ".join(f"{b} {head[b]:8.2f}" for b in BACKENDS)
              + f"   diff {row['max_abs_diff']}\n          each: {row['best_us_each']}", flush=True)
    with open(args.output_json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
