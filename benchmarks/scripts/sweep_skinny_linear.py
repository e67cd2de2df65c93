"""Times the skinny linear kernel (raygrid/kernels/triton_linear.py) over launch configurations against
cuBLAS (``torch.nn.functional.linear``) for 1 to 16 rows, at the weight shapes of Qwen3-0.6B and of the
8B-shaped Llama, in bf16; and checks each result against cuBLAS's. Bandwidth counts the weight read once.
Timed inside CUDA graphs (``do_bench_cudagraph``), as the engine's decode steps run: the recorded sweep
(``results/latency_h200/skinny_ab_ca015ca/sweep_skinny.json``) used ``do_bench``, whose launch overhead of about
8 us hid the kernels' differences.

    python benchmarks/scripts/sweep_skinny_linear.py --output-json sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F

from raygrid.bench.kernel_timing import cuda_graph_ms
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_linear import skinny_config, skinny_linear

SHAPES = {  # name: (N, K)
    "0.6b qkv": (4096, 1024), "0.6b o": (1024, 2048), "0.6b gate_up": (6144, 1024), "0.6b down": (1024, 3072),
    "8b qkv": (6144, 4096), "8b o": (4096, 4096), "8b gate_up": (28672, 4096), "8b down": (4096, 14336),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    launches = list(itertools.product((16, 32, 64), (128, 256), (2, 4), (3, 4, 6)))  # block_n, block_k, warps, stages
    results = []
    for (name, (n, k)), m in itertools.product(SHAPES.items(), (1, 4, 16)):
        w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        expected = F.linear(x, w)
        bytes_read = n * k * 2
        cublas = cuda_graph_ms(lambda: F.linear(x, w), rep=20)
        default = cuda_graph_ms(lambda: skinny_linear(x, w), rep=20)
        row = {"shape": name, "n": n, "k": k, "m": m, "cublas_us": round(cublas * 1e3, 2),
               "cublas_tb_per_s": round(bytes_read / cublas / 1e9, 2), "default": skinny_config(n, k),
               "default_us": round(default * 1e3, 2), "default_tb_per_s": round(bytes_read / default / 1e9, 2),
               "max_abs_error": (skinny_linear(x, w).float() - expected.float()).abs().max().item(), "launches": []}
        for block_n, block_k, warps, stages in launches:
            try:
                us = cuda_graph_ms(lambda: skinny_linear(x, w, block_n=block_n, block_k=block_k, num_warps=warps,
                                                              num_stages=stages), rep=20) * 1e3
            except Exception as error:  # noqa: BLE001 - a launch that does not fit is recorded
                row["launches"].append({"block_n": block_n, "block_k": block_k, "warps": warps, "stages": stages,
                                        "error": type(error).__name__})
                continue
            row["launches"].append({"block_n": block_n, "block_k": block_k, "warps": warps, "stages": stages,
                                    "us": round(us, 2), "tb_per_s": round(bytes_read / us / 1e6, 2)})
        best = min((r for r in row["launches"] if "us" in r), key=lambda r: r["us"])
        row["best"] = best
        results.append(row)
        print(f"{name:13s} M={m:2d}: cuBLAS {row['cublas_us']:7.2f} us ({row['cublas_tb_per_s']} TB/s), default "
              f"{row['default_us']:7.2f} us ({row['default_tb_per_s']} TB/s), best {best['us']:7.2f} us "
              f"(n{best['block_n']} k{best['block_k']} w{best['warps']} s{best['stages']}), error {row['max_abs_error']:.3g}",
              flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
