"""A Triton matrix product for linear layers: ``y = (x @ w.T) * x_scale * w_scale + bias`` with ``x [M, K]`` and
``w [N, K]`` (a layer's weight as stored), in bf16 or float8 e4m3 (per-token ``x_scale [M, 1]`` and per-channel
``w_scale [N]``, applied in the epilogue in float32). Its reference is ``models/layers/fp8.fp8_linear_ref`` for
float8 and ``F.linear`` otherwise.

Rows and columns past the matrix are clamped to its last row and column for the loads (so no load is masked) and
masked only at the store. K must be a multiple of ``BLOCK_K``. Programs that share a weight tile are numbered
next to each other, so the weight is read from memory once and from L2 by the rest.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(x_ptr, w_ptr, y_ptr, x_scale_ptr, w_scale_ptr, b_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                   HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tl.minimum(rows, M - 1).to(tl.int64)[:, None] * stride_xm + ks[None, :]
    w_ptrs = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * stride_wn + ks[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        acc = tl.dot(tl.load(x_ptrs), tl.trans(tl.load(w_ptrs)), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_SCALE:
        acc *= tl.load(x_scale_ptr + tl.minimum(rows, M - 1))[:, None]
        acc *= tl.load(w_scale_ptr + tl.minimum(cols, N - 1))[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + tl.minimum(cols, N - 1)).to(tl.float32)[None, :]
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(y_ptr + rows.to(tl.int64)[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


# Launches by rows (the largest M each serves), chosen on an H200 by benchmarks/scripts/sweep_matmul.py.
LAUNCHES = [
    (256, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=4)),
]


def launch_for(m: int) -> dict | None:
    for max_m, launch in LAUNCHES:
        if m <= max_m:
            return launch
    return None


def matmul(x: torch.Tensor, w: torch.Tensor, x_scale: torch.Tensor | None = None, w_scale: torch.Tensor | None = None,
           bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None, **launch) -> torch.Tensor:
    """``(x @ w.T) * x_scale * w_scale + bias`` in ``out_dtype`` (x's dtype by default; bf16 for float8 inputs
    unless given). ``launch`` overrides the tile shape (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)."""
    m, k = x.shape
    n = w.shape[0]
    launch = {**(launch_for(m) or LAUNCHES[-1][1]), **launch}
    if k % launch["BLOCK_K"] or x.stride(1) != 1 or w.stride(1) != 1:
        raise ValueError(f"matmul: K={k} must be a multiple of BLOCK_K={launch['BLOCK_K']}, with contiguous rows")
    if out_dtype is None:
        out_dtype = torch.bfloat16 if x.dtype == torch.float8_e4m3fn else x.dtype
    y = torch.empty(m, n, dtype=out_dtype, device=x.device)
    if m == 0:
        return y
    has_scale = x_scale is not None
    grid = (triton.cdiv(m, launch["BLOCK_M"]) * triton.cdiv(n, launch["BLOCK_N"]),)
    _matmul_kernel[grid](
        x, w, y, x_scale if has_scale else y, w_scale if has_scale else y, bias if bias is not None else y,
        m, n, k, x.stride(0), w.stride(0), y.stride(0), HAS_SCALE=has_scale, HAS_BIAS=bias is not None, **launch)
    return y
