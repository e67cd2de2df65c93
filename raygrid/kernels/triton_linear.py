"""A Triton kernel for the linear layers of small decode batches: ``y = x @ w.T (+ bias)`` with at most
``SKINNY_MAX_M`` rows of ``x``. Such a product only has to read the weights once, and it is bound by that
read. cuBLAS tiles it for many rows, so too few thread blocks share the read and reductions over K are
split and summed by a second kernel. Here each program owns ``BLOCK_N`` output columns, over the whole of K or,
for a weight too narrow to give every SM a program, over a slice of it (split-K): the slices' sums then meet in
float32, added up by whichever program of the column block finishes last, in the same launch (arrivals.py). The
reference is ``torch.nn.functional.linear``.

A layer whose output goes into the residual stream and the next RMSNorm (o_proj, down_proj) can have the kernel do
both: the program that stores the last column block adds the residual to the whole rows and normalizes them, so a
decode step at small batch saves the norm's launch twice a layer."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.arrivals import arrival_counters
from raygrid.kernels.pdl import pdl_launch, pdl_wait

SKINNY_MAX_M = 16  # rows (tokens) up to which the kernel replaces cuBLAS; tl.dot needs 16 rows anyway
NORM_MAX_N = 4096  # the widest rows the fused residual add and RMSNorm takes (a few rows at a time in registers)


@triton.jit
def _skinny_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrivals_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, eps,
    M, N, K, k_per_split, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, NORM: tl.constexpr, NORM_ROWS: tl.constexpr, BLOCK_ROW: tl.constexpr, GATED: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (n, s) sums ``BLOCK_N`` output columns over the s-th of ``SPLIT_K`` slices of K. With one slice
    it stores them. With several, each stores its float32 partial sums, and the program that arrives last at the
    columns' counter (``arrivals``) adds them all up, stores the output and sets the counter back to 0 for the
    next launch. With NORM, the program that stores the last column block then adds the residual to the whole rows
    and RMS-normalizes them (``_add_rms_norm_rows``). With GATED (K whole), the weight has 2N rows, gate then up,
    and the program stores SiLU(gate) * up for its N columns (``_silu_and_mul_kernel``'s rounding)."""
    pdl_wait(PDL)
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # GATED: the up half's sums (acc holds the gate's)
    k_start = pid_k * k_per_split
    for k in range(k_start, k_start + k_per_split, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        x_mask = row_ok[:, None]
        w_mask = col_ok[:, None]
        if not EVEN_K:
            x_mask = x_mask & (ks < K)[None, :]
            w_mask = w_mask & (ks < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + ks[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + cols[:, None] * stride_wn + ks[None, :], mask=w_mask, other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        if GATED:
            w_up = tl.load(w_ptr + (N + cols)[:, None] * stride_wn + ks[None, :], mask=w_mask, other=0.0)
            up = tl.dot(x, tl.trans(w_up), up)
    out_mask = row_ok[:, None] & col_ok[None, :]
    if GATED:
        dtype = y_ptr.dtype.element_ty
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            up += tl.load(b_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        gate = acc.to(dtype).to(tl.float32)
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype)
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], (silu * up.to(dtype)).to(dtype), mask=out_mask)
    elif SPLIT_K > 1:
        partials = partial_ptr + rows[:, None] * N + cols[None, :]  # [SPLIT_K, BLOCK_M, N] float32
        tl.store(partials + pid_k * BLOCK_M * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's stores before the counter's release
        arrived = tl.atomic_add(arrivals_ptr + pid_n, 1, sem="acq_rel", scope="gpu")  # after the store, before the loads
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                acc += tl.load(partials + split * BLOCK_M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(arrivals_ptr + pid_n, 0)
            if NORM:
                _last_block_norms(arrivals_ptr + tl.num_programs(0), tl.num_programs(0), y_ptr, res_ptr, norm_w_ptr,
                                  normed_ptr, res_out_ptr, M, N, stride_ym, eps, NORM_ROWS, BLOCK_ROW)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
        if NORM:
            _last_block_norms(arrivals_ptr + tl.num_programs(0), tl.num_programs(0), y_ptr, res_ptr, norm_w_ptr,
                              normed_ptr, res_out_ptr, M, N, stride_ym, eps, NORM_ROWS, BLOCK_ROW)


@triton.jit
def _last_block_norms(counter, column_blocks, y_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, M, N, stride_ym,
                      eps, NORM_ROWS: tl.constexpr, BLOCK_ROW: tl.constexpr):
    """Called by each program that stored a column block: the last of them to arrive normalizes the rows."""
    tl.debug_barrier()  # every thread's stores before the counter's release
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == column_blocks - 1:
        _add_rms_norm_rows(y_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, M, N, stride_ym, eps, NORM_ROWS, BLOCK_ROW)
        tl.atomic_xchg(counter, 0)


@triton.jit
def _add_rms_norm_rows(y_ptr, res_ptr, norm_w_ptr, normed_ptr, res_out_ptr, M, N, stride_ym, eps,
                       NORM_ROWS: tl.constexpr, BLOCK_ROW: tl.constexpr):
    """``res_out = y + res`` and ``normed = RMSNorm(res_out) * w`` over M whole rows of N, NORM_ROWS at a time,
    rounded as triton_ops' ``_rms_norm_kernel`` rounds them. ``y`` was stored by other programs of this launch, so
    its loads skip L1 (``.cg``)."""
    cols = tl.arange(0, BLOCK_ROW)
    col_ok = cols < N
    w = tl.load(norm_w_ptr + cols, mask=col_ok, other=0.0)
    for first in range(0, M, NORM_ROWS):
        rows = first + tl.arange(0, NORM_ROWS)
        mask = (rows < M)[:, None] & col_ok[None, :]
        at = rows[:, None] * N + cols[None, :]
        y = tl.load(y_ptr + rows[:, None] * stride_ym + cols[None, :], mask=mask, other=0.0, cache_modifier=".cg")
        x = (y + tl.load(res_ptr + at, mask=mask, other=0.0)).to(y_ptr.dtype.element_ty)
        tl.store(res_out_ptr + at, x, mask=mask)
        x32 = x.to(tl.float32)
        var = tl.sum(x32 * x32, axis=1) / N
        normed = (x32 * tl.rsqrt(var + eps)[:, None]).to(y_ptr.dtype.element_ty)
        tl.store(normed_ptr + at, (w[None, :] * normed).to(normed_ptr.dtype.element_ty), mask=mask)


def skinny_config(n: int, k: int) -> dict:
    """Columns a program, slices of K and the pipeline for an [N, K] weight: chosen on an H200 by
    benchmarks/scripts/sweep_skinny_linear.py, chains of 28 launches over 28 weights in a CUDA graph
    (benchmarks/README.md). Each best launch had about one program an SM: 32 columns a program, 64 for the widest
    weights, and a narrow weight (N <= 2048: Qwen3-0.6B's o and down) sliced in 4 over K, which took its launch from
    6.0 to 4.6 us and from 8.2 to 5.4 us."""
    return dict(block_n=64 if n > 4096 else 32, block_k=128, split_k=4 if n <= 2048 else 1, num_warps=4, num_stages=4)


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int | None = None,
                  block_k: int | None = None, split_k: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None, residual: torch.Tensor | None = None,
                  norm_weight: torch.Tensor | None = None, eps: float = 0.0, silu_and_mul: bool = False):
    """``x [M, K] @ weight[N, K].T + bias`` for M <= SKINNY_MAX_M; launch settings default to skinny_config.
    ``split_k`` slices K over that many programs a column block (more programs for a narrow weight).

    With ``residual`` and ``norm_weight`` (``[M, N]`` and ``[N]``), returns ``(normed, y + residual)`` where ``normed``
    is the RMSNorm of ``y + residual`` (``rms_norm(y, norm_weight, eps, residual)`` of triton_ops), in the same launch;
    None if that cannot be (rows wider than NORM_MAX_N, or no arrival counters while a graph is captured).

    With ``silu_and_mul`` (a gate_up weight, ``[2N, K]``: gate rows then up rows), returns ``silu_and_mul(y)``
    (``[M, N]``), each program taking N's columns of both halves over the whole of K."""
    m, k = x.shape
    n = weight.shape[0] // 2 if silu_and_mul else weight.shape[0]
    if m > SKINNY_MAX_M:
        raise ValueError(f"skinny_linear takes at most {SKINNY_MAX_M} rows (got {m})")
    x = x if x.stride(-1) == 1 else x.contiguous()
    config = skinny_config(weight.shape[0], k)
    # silu_and_mul: each program reads a tile of each half a step, as many weight bytes as the plain launch's programs
    block_n = block_n or (max(16, config["block_n"] // 2) if silu_and_mul else config["block_n"])
    block_k = block_k or config["block_k"]
    split_k = 1 if silu_and_mul else split_k or config["split_k"]
    column_blocks = triton.cdiv(n, block_n)
    norm = norm_weight is not None
    if norm and silu_and_mul:
        raise ValueError("skinny_linear: silu_and_mul and a norm in one launch are not supported")
    if norm and (n > NORM_MAX_N or residual.shape != (m, n) or not residual.is_contiguous()):
        return None
    arrivals = arrival_counters(x.device, column_blocks + 1) if split_k > 1 or norm else None
    if arrivals is None:
        if norm:
            return None
        split_k = 1
    k_per_split = triton.cdiv(triton.cdiv(k, block_k), split_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty slice
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    partials = torch.empty(split_k, 16, n, dtype=torch.float32, device=x.device) if split_k > 1 else y
    normed, res_out = (torch.empty_like(y), torch.empty_like(y)) if norm else (y, y)
    block_row = triton.next_power_of_2(n)
    _skinny_linear_kernel[(column_blocks, split_k)](
        x, weight, bias if bias is not None else weight, y, partials, arrivals if arrivals is not None else y,
        residual if norm else y, norm_weight if norm else y, normed, res_out, eps, m, n, k,
        k_per_split, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % k_per_split == 0, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, NORM=norm, NORM_ROWS=min(triton.next_power_of_2(m), max(1, NORM_MAX_N // block_row)),
        BLOCK_ROW=block_row, GATED=silu_and_mul, num_warps=num_warps or config["num_warps"],
        num_stages=num_stages or config["num_stages"],
        **pdl_launch(x.device),
    )
    return (normed, res_out) if norm else y
