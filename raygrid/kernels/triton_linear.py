"""A Triton kernel for the linear layers of small decode batches: ``y = x @ w.T (+ bias)`` with at most
``SKINNY_MAX_M`` rows of ``x``. Such a product only has to read the weights once, and it is bound by that
read. cuBLAS tiles it for many rows, so too few thread blocks share the read and reductions over K are
split and summed by a second kernel. Here each program owns ``BLOCK_N`` output columns over the whole of K:
narrow enough to give every SM several programs, each streaming its slice of the weights through a deep
pipeline. The reference is ``torch.nn.functional.linear``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.pdl import pdl_launch, pdl_wait

SKINNY_MAX_M = 16  # rows (tokens) up to which the kernel replaces cuBLAS; tl.dot needs 16 rows anyway


@triton.jit
def _skinny_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        x_mask = row_ok[:, None]
        w_mask = col_ok[:, None]
        if not EVEN_K:
            x_mask = x_mask & (ks < K)[None, :]
            w_mask = w_mask & (ks < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=w_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def skinny_config(n: int, k: int) -> dict:
    """Columns a program and the pipeline for an [N, K] weight: chosen on an H200 by
    benchmarks/scripts/sweep_skinny_linear.py (benchmarks/README.md)."""
    return dict(block_n=16 if n <= 2048 else 32, block_k=128, num_warps=4, num_stages=4)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int | None = None,
                  block_k: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T + bias`` for M <= SKINNY_MAX_M; launch settings default to skinny_config."""
    m, k = x.shape
    n = weight.shape[0]
    if m > SKINNY_MAX_M:
        raise ValueError(f"skinny_linear takes at most {SKINNY_MAX_M} rows (got {m})")
    x = x if x.stride(-1) == 1 else x.contiguous()
    config = skinny_config(n, k)
    block_n, block_k = block_n or config["block_n"], block_k or config["block_k"]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    _skinny_linear_kernel[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % block_k == 0, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps or config["num_warps"], num_stages=num_stages or config["num_stages"], **pdl_launch(x.device),
    )
    return y
