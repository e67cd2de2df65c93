"""The FP8 linear layer's parts against bf16, timed inside CUDA graphs (Triton's ``do_bench_cudagraph``, so
launch overhead is not counted, as in the engine's decode graphs; the recorded run at 6273506 replayed a graph
of 20 calls of its own), at the 8B-shaped Llama's weight shapes
and batch sizes from decode to prefill:

- ``bf16``: ``ops.linear`` on bf16 weights (the skinny kernel or cuBLAS);
- ``quant_torch`` / ``quant_triton``: per-token activation quantization, the torch reference and the kernel;
- ``mm_rowwise`` (and ``_fast``: ``use_fast_accum``): ``torch._scaled_mm`` with a scale per token and per channel
  (CUTLASS);
- ``mm_tensorwise`` (and ``_fast``): ``torch._scaled_mm`` with unit scales (cuBLASLt);
- ``layer_rowwise``, ``layer_tensorwise``: the whole FP8 layer (quantization, product, scales) either way;
- ``fp8_layer``: ``ops.linear`` on the float8 weights, as the engine runs it (which way is FP8_TENSORWISE_MAX_M's).

Each result is checked against its reference. ``python benchmarks/scripts/sweep_fp8_linear.py --output-json OUT.json``
"""

from __future__ import annotations

import argparse
import json

import torch

from raygrid.bench.kernel_timing import cuda_graph_ms
from raygrid.bench.throughput import provenance
from raygrid.kernels import ops
from raygrid.kernels.elementwise_ref import MIN_SCALE, quantize_per_token
from raygrid.kernels.triton_quant import per_token_quant_fp8, scale_fp8_product
from raygrid.models.layers.fp8 import fp8_linear_ref, quantize_per_channel

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # (N, K)


def graph_us(fn) -> float:
    """Microseconds a call of ``fn`` takes replayed inside a CUDA graph (launch overhead not counted)."""
    return cuda_graph_ms(fn, rep=20) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 64, 128, 256, 512, 2048, 8192])
    args = parser.parse_args()
    results = []
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        w_q, w_scale = quantize_per_channel(w)
        w_t = w_q.t()
        one = torch.ones((), dtype=torch.float32, device="cuda")
        for m in args.rows:
            x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
            x_q, x_scale = per_token_quant_fp8(x, MIN_SCALE)
            ref_q, ref_scale = quantize_per_token(x)
            checks = {"quant_bitwise": bool(torch.equal(x_q.view(torch.uint8), ref_q.view(torch.uint8))
                                            and torch.equal(x_scale, ref_scale))}
            y_raw = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            expected = fp8_linear_ref(x, w_q, w_scale).float()
            for way, product in (("rowwise", ops.fp8_product_rowwise), ("tensorwise", ops.fp8_product_tensorwise)):
                got = product(x_q, x_scale, w_q, w_scale, None, x.dtype).float()
                checks[f"{way}_rel_error"] = ((got - expected).abs().max() / expected.abs().max()).item()
            row = {"shape": name, "n": n, "k": k, "m": m, "checks": checks, "us": {
                "bf16": graph_us(lambda: ops.linear(x, w)),
                "quant_torch": graph_us(lambda: quantize_per_token(x)),
                "quant_triton": graph_us(lambda: per_token_quant_fp8(x, MIN_SCALE)),
                "mm_rowwise": graph_us(lambda: torch._scaled_mm(x_q, w_t, scale_a=x_scale, scale_b=w_scale.view(1, -1),
                                                                out_dtype=torch.bfloat16)),
                "mm_rowwise_fast": graph_us(lambda: torch._scaled_mm(x_q, w_t, scale_a=x_scale, scale_b=w_scale.view(1, -1),
                                                                     out_dtype=torch.bfloat16, use_fast_accum=True)),
                "mm_tensorwise": graph_us(lambda: torch._scaled_mm(x_q, w_t, scale_a=one, scale_b=one,
                                                                   out_dtype=torch.bfloat16)),
                "mm_tensorwise_fast": graph_us(lambda: torch._scaled_mm(x_q, w_t, scale_a=one, scale_b=one,
                                                                        out_dtype=torch.bfloat16, use_fast_accum=True)),
                "scale_epilogue": graph_us(lambda: scale_fp8_product(y_raw, x_scale, w_scale, None)),
                "layer_rowwise": graph_us(lambda: ops.fp8_product_rowwise(*per_token_quant_fp8(x, MIN_SCALE), w_q, w_scale,
                                                                          None, x.dtype)),
                "layer_tensorwise": graph_us(lambda: ops.fp8_product_tensorwise(*per_token_quant_fp8(x, MIN_SCALE), w_q,
                                                                                w_scale, None, x.dtype)),
                "fp8_layer": graph_us(lambda: ops.linear(x, w_q, None, w_scale)),
            }}
            row["us"] = {key: round(value, 2) for key, value in row["us"].items()}
            results.append(row)
            print(f"{name:8s} M={m:5d} " + " ".join(f"{key} {value:8.2f}" for key, value in row["us"].items()), checks, flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
