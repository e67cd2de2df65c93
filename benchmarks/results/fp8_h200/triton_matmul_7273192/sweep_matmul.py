"""The Triton matrix product (``kernels/triton_matmul.py``) against what linear layers run now, inside CUDA graphs
(``do_bench_cudagraph``: launch overhead left out), over tile shapes:

- float8 on the 8B shape's layers (qkv 6144 x 4096, o 4096 x 4096, gate_up 28672 x 4096, down 4096 x 14336):
  against bf16 ``F.linear``, ``torch._scaled_mm`` with row-wise scales (CUTLASS), and unit scales (cuBLASLt) plus
  the scaling kernel. Activations come quantized; the quantization is the same for every path and left out.
- bf16 on Qwen3-0.6B's (4096 x 1024, 1024 x 2048, 6144 x 1024, 1024 x 3072): against ``F.linear`` (cuBLAS).

Each result is checked against float32's product of the same inputs (max error over the largest value).

    python benchmarks/scripts/sweep_matmul.py --output-json OUT.json [--rows 128 256]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from raygrid.bench.throughput import provenance
from raygrid.kernels.ops import fp8_product_rowwise, fp8_product_tensorwise
from raygrid.kernels.triton_matmul import matmul
from raygrid.kernels.triton_quant import per_token_quant_fp8

FP8_LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
BF16_LAYERS = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
FP8_TILES = [(128, 128, 128, 8, 4), (128, 128, 128, 4, 4), (128, 256, 128, 8, 3), (64, 128, 128, 4, 5),
             (64, 256, 128, 8, 4), (128, 64, 128, 4, 5), (256, 128, 128, 8, 3), (64, 64, 128, 4, 6)]
BF16_TILES = [(128, 128, 64, 8, 4), (128, 128, 64, 4, 4), (64, 128, 64, 4, 5), (128, 64, 64, 4, 5),
              (64, 64, 64, 4, 6), (128, 256, 64, 8, 3), (64, 256, 64, 8, 4), (256, 128, 64, 8, 3)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 128, 192, 256, 512, 2048])
    parser.add_argument("--dtypes", nargs="+", default=["fp8", "bf16"], choices=["fp8", "bf16"])
    parser.add_argument("--rep", type=int, default=20, help="milliseconds of replays per timing")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows_out = []

    def timed(row: dict, fn, expected: torch.Tensor) -> None:
        try:
            got = fn().float()
            error = ((got - expected).abs().max() / expected.abs().max()).item()
            us = do_bench_cudagraph(fn, rep=args.rep) * 1e3
        except Exception as exc:  # noqa: BLE001 - a tile that does not compile or fit is recorded, not fatal
            rows_out.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:160]}"})
            print(rows_out[-1], flush=True)
            return
        flops = 2 * row["m"] * row["n"] * row["k"]
        rows_out.append({**row, "us": round(us, 2), "tflop_per_s": round(flops / us / 1e6, 1), "rel_error": round(error, 5)})
        print(" ".join(f"{k}={v}" for k, v in rows_out[-1].items()), flush=True)

    for dtype in args.dtypes:
        layers, tiles = (FP8_LAYERS, FP8_TILES) if dtype == "fp8" else (BF16_LAYERS, BF16_TILES)
        for name, (n, k) in layers.items():
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05
            if dtype == "fp8":
                w_scale = w.float().abs().amax(1) / 448
                w_q = (w.float() / w_scale[:, None]).to(torch.float8_e4m3fn)
            for m in args.rows:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                base = dict(dtype=dtype, layer=name, m=m, n=n, k=k)
                if dtype == "fp8":
                    x_q, x_scale = per_token_quant_fp8(x, 1e-12)
                    expected = (x_q.float() @ w_q.float().t()) * x_scale * w_scale[None, :]
                    timed({**base, "path": "bf16 F.linear"}, lambda: F.linear(x, w), expected)
                    timed({**base, "path": "fp8 row-wise _scaled_mm"},
                          lambda: fp8_product_rowwise(x_q, x_scale, w_q, w_scale, None, torch.bfloat16), expected)
                    timed({**base, "path": "fp8 unit-scale + scaling"},
                          lambda: fp8_product_tensorwise(x_q, x_scale, w_q, w_scale, None, torch.bfloat16), expected)
                    for bm, bn, bk, warps, stages in tiles:
                        launch = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
                        timed({**base, "path": "triton", **launch},
                              lambda: matmul(x_q, w_q, x_scale, w_scale, **launch), expected)
                else:
                    expected = x.float() @ w.float().t()
                    timed({**base, "path": "bf16 F.linear"}, lambda: F.linear(x, w), expected)
                    for bm, bn, bk, warps, stages in tiles:
                        launch = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
                        timed({**base, "path": "triton", **launch}, lambda: matmul(x, w, **launch), expected)
                mine = [r for r in rows_out if r.get("path") == "triton" and r["layer"] == name and r["m"] == m
                        and r["dtype"] == dtype and "us" in r]
                if mine:
                    best = min(mine, key=lambda r: r["us"])
                    print(f"  best {dtype} {name} m={m}: {best['us']} us {best}", flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "triton": __import__("triton").__version__, "torch": torch.__version__,
                       "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
