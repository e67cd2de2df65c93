"""A Triton kernel for the linear layers of small decode batches: ``y = x @ w.T (+ bias)`` with at most
``SKINNY_MAX_M`` rows of ``x``. Such a product only has to read the weights once, and it is bound by that
read. cuBLAS tiles it for many rows, so too few thread blocks share the read and reductions over K are
split and summed by a second kernel. Here each program owns ``BLOCK_N`` output columns, over the whole of K or,
for a weight too narrow to give every SM a program, over a slice of it (split-K): the slices' sums then meet in
float32, added up by whichever program of the column block finishes last, in the same launch. The reference is
``torch.nn.functional.linear``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.pdl import pdl_launch, pdl_wait

SKINNY_MAX_M = 16  # rows (tokens) up to which the kernel replaces cuBLAS; tl.dot needs 16 rows anyway


@triton.jit
def _skinny_linear_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, partial_ptr, arrivals_ptr, M, N, K, k_per_split, stride_xm, stride_wn, stride_ym,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, PDL: tl.constexpr,
):
    """Program (n, s) sums ``BLOCK_N`` output columns over the s-th of ``SPLIT_K`` slices of K. With one slice
    it stores them. With several, each stores its float32 partial sums, and the program that arrives last at the
    columns' counter (``arrivals``) adds them all up, stores the output and sets the counter back to 0 for the
    next launch."""
    pdl_wait(PDL)
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < M
    col_ok = cols < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
    out_mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K > 1:
        partials = partial_ptr + rows[:, None] * N + cols[None, :]  # [SPLIT_K, BLOCK_M, N] float32
        tl.store(partials + pid_k * BLOCK_M * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's stores before the one thread's release (the atomic below)
        arrived = tl.atomic_add(arrivals_ptr + pid_n, 1, sem="acq_rel", scope="gpu")  # after the store, before the loads
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                acc += tl.load(partials + split * BLOCK_M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(arrivals_ptr + pid_n, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * stride_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=out_mask)


def skinny_config(n: int, k: int) -> dict:
    """Columns a program, slices of K and the pipeline for an [N, K] weight: chosen on an H200 by
    benchmarks/scripts/sweep_skinny_linear.py, chains of 28 launches over 28 weights in a CUDA graph
    (benchmarks/README.md). Each best launch had about one program an SM: 32 columns a program, 64 for the widest
    weights, and a narrow weight (N <= 2048: Qwen3-0.6B's o and down) sliced in 4 over K, which took its launch from
    6.0 to 4.6 us and from 8.2 to 5.4 us."""
    return dict(block_n=64 if n > 4096 else 32, block_k=128, split_k=4 if n <= 2048 else 1, num_warps=4, num_stages=4)


# Per device: one arrival counter per column block of a split-K launch, all 0 between launches (the last program of
# each block sets its counter back). 64 KiB a device for the process's life, as cuBLAS keeps its workspaces; CUDA
# graphs captured with split launches hold its address. Launches one after another share it, so split launches must
# not run on two streams of one device at once: raygrid runs a device's forward passes on one stream. Made by the
# first split launch outside a capture (the graphs' warm-up runs); a launch captured before that takes K whole.
_ARRIVALS: dict[torch.device, torch.Tensor] = {}
_MAX_COLUMN_BLOCKS = 16384


def _arrivals(device: torch.device) -> torch.Tensor | None:
    counters = _ARRIVALS.get(device)
    if counters is None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        counters = _ARRIVALS[device] = torch.zeros(_MAX_COLUMN_BLOCKS, dtype=torch.int32, device=device)
    return counters


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, block_n: int | None = None,
                  block_k: int | None = None, split_k: int | None = None, num_warps: int | None = None,
                  num_stages: int | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T + bias`` for M <= SKINNY_MAX_M; launch settings default to skinny_config.
    ``split_k`` slices K over that many programs a column block (more programs for a narrow weight)."""
    m, k = x.shape
    n = weight.shape[0]
    if m > SKINNY_MAX_M:
        raise ValueError(f"skinny_linear takes at most {SKINNY_MAX_M} rows (got {m})")
    x = x if x.stride(-1) == 1 else x.contiguous()
    config = skinny_config(n, k)
    block_n, block_k = block_n or config["block_n"], block_k or config["block_k"]
    split_k = split_k or config["split_k"]
    column_blocks = triton.cdiv(n, block_n)
    arrivals = _arrivals(x.device) if split_k > 1 and column_blocks <= _MAX_COLUMN_BLOCKS else None
    if arrivals is None:
        split_k = 1
    k_per_split = triton.cdiv(triton.cdiv(k, block_k), split_k) * block_k
    split_k = triton.cdiv(k, k_per_split)  # no empty slice
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    partials = torch.empty(split_k, 16, n, dtype=torch.float32, device=x.device) if split_k > 1 else y
    _skinny_linear_kernel[(column_blocks, split_k)](
        x, weight, bias if bias is not None else weight, y, partials, arrivals if split_k > 1 else y, m, n, k,
        k_per_split, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, EVEN_K=k % k_per_split == 0, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, num_warps=num_warps or config["num_warps"], num_stages=num_stages or config["num_stages"],
        **pdl_launch(x.device),
    )
    return y
