"""Prompt-step elementwise kernels with several rows a program, against the engine's one row a program: RMSNorm
with its residual add (hidden 1024) and SiLU-and-mul (n 3072), Qwen3-0.6B's shapes, bf16, at 2,048 and 16,384
tokens. Reports each launch's time and memory throughput, and checks each variant's output against the engine
kernel's (they must be equal: the same arithmetic per row).

Each timing is a chain of 8 launches over 8 different inputs (none in L2), captured in one CUDA graph (``chain_us``).

    python benchmarks/scripts/sweep_rows_per_program.py --output-json sweep.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_ops import rms_norm, silu_and_mul

COPIES = 8


@triton.jit
def _rms_rows(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, num_rows, n, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < num_rows)[:, None] & (cols < n)[None, :]
    offsets = rows[:, None].to(tl.int64) * n + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    x = (x + tl.load(res_ptr + offsets, mask=mask, other=0.0)).to(x_ptr.dtype.element_ty)
    tl.store(res_out_ptr + offsets, x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, axis=1) / n
    y = (x32 * tl.rsqrt(var + eps)[:, None]).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=cols < n, other=0.0)
    tl.store(out_ptr + offsets, (w[None, :] * y).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_rows(x_ptr, out_ptr, num_rows, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = (rows < num_rows)[:, None] & (cols < n)[None, :]
    base = rows[:, None].to(tl.int64) * (2 * n) + cols[None, :]
    gate = tl.load(x_ptr + base, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + base + n, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * n + cols[None, :], (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def rms_rows(x, residual, weight, eps, rows, warps):
    out, res_out = torch.empty_like(x), torch.empty_like(x)
    _rms_rows[(triton.cdiv(x.shape[0], rows),)](x, residual, weight, out, res_out, x.shape[0], x.shape[1], eps, ROWS=rows,
                                                 BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=warps)
    return out, res_out


def silu_rows(x, rows, block, warps):
    n = x.shape[1] // 2
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    _silu_rows[(triton.cdiv(x.shape[0], rows), triton.cdiv(n, block))](x, out, x.shape[0], n, ROWS=rows, BLOCK=block,
                                                                        num_warps=warps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 16384])
    args = parser.parse_args()
    rows_out = []
    for t in args.tokens:
        xs = [torch.randn(t, 1024, dtype=torch.bfloat16, device="cuda") for _ in range(COPIES)]
        rs = [torch.randn(t, 1024, dtype=torch.bfloat16, device="cuda") for _ in range(COPIES)]
        w = torch.randn(1024, dtype=torch.bfloat16, device="cuda")
        nbytes = 4 * t * 1024 * 2
        engine = rms_norm(xs[0], w, 1e-6, rs[0])
        row = {"kernel": "rms_norm+residual", "tokens": t, "engine_us": chain_us([lambda i=i: rms_norm(xs[i], w, 1e-6, rs[i]) for i in range(COPIES)])}
        row["engine_tb_per_s"] = round(nbytes / row["engine_us"] / 1e6, 2)
        row["variants"] = []
        for rows, warps in [(1, 4), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8)]:
            equal = all(torch.equal(a, b) for a, b in zip(rms_rows(xs[0], rs[0], w, 1e-6, rows, warps), engine))
            us = chain_us([lambda i=i: rms_rows(xs[i], rs[i], w, 1e-6, rows, warps) for i in range(COPIES)])
            row["variants"].append({"rows": rows, "warps": warps, "us": round(us, 2), "tb_per_s": round(nbytes / us / 1e6, 2), "equal": equal})
        print(json.dumps(row), flush=True)
        rows_out.append(row)
        gs = [torch.randn(t, 6144, dtype=torch.bfloat16, device="cuda") for _ in range(COPIES)]
        nbytes = t * 3072 * 3 * 2
        engine = silu_and_mul(gs[0])
        row = {"kernel": "silu_and_mul", "tokens": t, "engine_us": chain_us([lambda i=i: silu_and_mul(gs[i]) for i in range(COPIES)])}
        row["engine_tb_per_s"] = round(nbytes / row["engine_us"] / 1e6, 2)
        row["variants"] = []
        for rows, block, warps in [(1, 1024, 4), (2, 1024, 4), (4, 1024, 4), (4, 1024, 8), (8, 1024, 8), (2, 2048, 8), (16, 512, 8)]:
            equal = torch.equal(silu_rows(gs[0], rows, block, warps), engine)
            us = chain_us([lambda i=i: silu_rows(gs[i], rows, block, warps) for i in range(COPIES)])
            row["variants"].append({"rows": rows, "block": block, "warps": warps, "us": round(us, 2),
                                    "tb_per_s": round(nbytes / us / 1e6, 2), "equal": equal})
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows_out, **provenance()}, f, indent=2)


if __name__ == "__main__":
    main()
