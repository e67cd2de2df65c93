"""The fused mixture-of-experts kernel: its definition is ``fused_moe_ref`` in ``moe_ref.py``.

1. ``align_by_expert``: the T*k (token, slot) pairs are sorted by expert and each expert's run is padded
   to a multiple of BLOCK_M, so that every block of BLOCK_M rows belongs to one expert. Every shape here
   depends only on T, k and the number of experts, never on the routing: it works inside CUDA graphs.
2. ``_grouped_gemm_kernel`` once for gate_up (rows of the hidden states, one per pair), SiLU-and-mul, and
   once more for down, which also multiplies each row by its routing weight.
3. The k rows of each token are summed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.triton_ops import silu_and_mul


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Returns ``sorted_pairs`` (pair indices t*k + slot in expert order, each expert's run padded to
    ``block_m`` with the invalid index T*k), ``block_expert`` (the expert of each block of ``block_m`` rows;
    ``num_experts`` for blocks past the end) and ``num_padded`` (a one-element tensor: rows in use)."""
    flat = topk_ids.flatten().long()
    num_pairs = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    max_rows = num_pairs + num_experts * (block_m - 1)
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank_in_expert = torch.arange(num_pairs, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[starts[expert_of] + rank_in_expert] = order.to(torch.int32)
    block_starts = torch.arange(0, max_rows, block_m, device=flat.device)
    block_expert = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)  # num_experts past the end
    return sorted_pairs, block_expert, ends[-1:].to(torch.int32)


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, c_ptr, weights_ptr, sorted_pairs_ptr, block_expert_ptr, num_padded_ptr,
                         N, K, num_pairs, stride_a, stride_we, stride_wn, stride_c, rows_per_a: tl.constexpr,
                         MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[pair, n] = A[pair // rows_per_a, :] . W[expert, n, :] (times the pair's routing weight)."""
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = tl.where(valid, pairs // rows_per_a, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_a + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = offs_k < K - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)[:, None]
    c_ptrs = c_ptr + pairs[:, None] * stride_c + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def _grouped_gemm(a, w, c, topk_weights, sorted_pairs, block_expert, num_padded, rows_per_a: int, mul_weight: bool,
                  block_m: int) -> None:
    num_experts, n, k = w.shape
    block_n, block_k = min(64, max(16, triton.next_power_of_2(n))), min(64, max(16, triton.next_power_of_2(k)))
    grid = (triton.cdiv(sorted_pairs.numel(), block_m), triton.cdiv(n, block_n))
    _grouped_gemm_kernel[grid](a, w, c, topk_weights, sorted_pairs, block_expert, num_padded, n, k, c.shape[0],
                               a.stride(0), w.stride(0), w.stride(1), c.stride(0), rows_per_a=rows_per_a,
                               MUL_WEIGHT=mul_weight, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, block_m: int = 16) -> torch.Tensor:
    """As ``fused_moe_ref``: hidden ``[T, H]``, w13 ``[E, 2I, H]``, w2 ``[E, H, I]``, topk ``[T, k]``."""
    num_tokens, top_k = topk_ids.shape
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    sorted_pairs, block_expert, num_padded = align_by_expert(topk_ids, w13.shape[0], block_m)
    pairs = num_tokens * top_k
    gate_up = torch.empty(pairs, w13.shape[1], dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(hidden, w13, gate_up, topk_weights, sorted_pairs, block_expert, num_padded, top_k, False, block_m)
    act = silu_and_mul(gate_up)
    down = torch.empty(pairs, w2.shape[1], dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.contiguous().view(-1)
    _grouped_gemm(act, w2, down, weights, sorted_pairs, block_expert, num_padded, 1, True, block_m)
    return down.view(num_tokens, top_k, -1).sum(dim=1)
