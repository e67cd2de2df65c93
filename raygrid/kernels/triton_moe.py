"""The fused mixture-of-experts kernel: its definition is ``fused_moe_ref`` in ``moe_ref.py``.

1. ``align_by_expert``: the T*k (token, slot) pairs are grouped by expert and each expert's run is padded
   to a multiple of BLOCK_M, so that every block of BLOCK_M rows belongs to one expert. Every shape here
   depends only on T, k and the number of experts, never on the routing: it works inside CUDA graphs.
2. ``_grouped_gemm_kernel`` once for gate_up (rows of the hidden states, one per pair), SiLU-and-mul, and
   once more for down, which also multiplies each row by its routing weight.
3. The k rows of each token are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from raygrid.kernels.triton_ops import silu_and_mul


@triton.jit
def _count_experts_kernel(ids_ptr, cursor_ptr, block_expert_ptr, num_padded_ptr, num_pairs, num_experts, max_rows,
                          block_m, E_BINS: tl.constexpr, BLOCK: tl.constexpr):
    """One program: each expert's pair count, padded to ``block_m``; the start of each expert's run (into
    ``cursor``, which the place kernel advances), the expert of every block, and the rows in use."""
    counts = tl.zeros((E_BINS,), dtype=tl.int32)
    for off in range(0, num_pairs, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        experts = tl.load(ids_ptr + idx, mask=idx < num_pairs, other=num_experts)  # bin num_experts: ignored
        counts += tl.histogram(experts, E_BINS)
    bins = tl.arange(0, E_BINS)
    counts = tl.where(bins < num_experts, counts, 0)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + bins, ends - padded, mask=bins < num_experts)
    tl.store(num_padded_ptr, tl.sum(padded, 0))
    for off in range(0, tl.cdiv(max_rows, block_m), 256):
        blocks = off + tl.arange(0, 256)
        # A block's expert is the number of experts whose run ends at or before the block's first row.
        first_row = blocks * block_m
        expert = tl.sum(((ends[None, :] <= first_row[:, None]) & (bins[None, :] < num_experts)).to(tl.int32), 1)
        tl.store(block_expert_ptr + blocks, expert, mask=first_row < max_rows)


@triton.jit
def _place_pairs_kernel(ids_ptr, cursor_ptr, sorted_pairs_ptr, num_pairs, num_experts, BLOCK: tl.constexpr):
    """Each pair takes the next free row of its expert's run. Rows within a run come in any order: a row's
    result does not depend on where it sits. A pair of an expert held elsewhere (id >= num_experts) takes none."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    experts = tl.load(ids_ptr + idx, mask=idx < num_pairs, other=0)
    valid = (idx < num_pairs) & (experts >= 0) & (experts < num_experts)
    rows = tl.atomic_add(cursor_ptr + experts, tl.full((BLOCK,), 1, tl.int32), mask=valid)
    tl.store(sorted_pairs_ptr + rows, idx.to(tl.int32), mask=valid)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """As ``moe_ref.align_by_expert_ref``, in a fill and two launches: ``sorted_pairs`` (pair indices t*k + slot grouped
    by expert, each expert's run padded to ``block_m`` with the invalid index T*k), ``block_expert`` (the
    expert of each block of ``block_m`` rows; ``num_experts`` past the end) and ``num_padded`` (one element:
    rows in use). Only the order of pairs within an expert's run may differ from the reference."""
    flat = topk_ids.flatten().to(torch.int32)
    num_pairs = flat.numel()
    max_rows = num_pairs + num_experts * (block_m - 1)
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(triton.cdiv(max_rows, block_m), dtype=torch.int32, device=flat.device)
    num_padded = torch.empty(1, dtype=torch.int32, device=flat.device)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=flat.device)
    _count_experts_kernel[(1,)](flat, cursor, block_expert, num_padded, num_pairs, num_experts, max_rows, block_m,
                                E_BINS=triton.next_power_of_2(num_experts + 1), BLOCK=1024)
    place = 256
    _place_pairs_kernel[(triton.cdiv(num_pairs, place),)](flat, cursor, sorted_pairs, num_pairs, num_experts, BLOCK=place)
    return sorted_pairs, block_expert, num_padded


@triton.jit
def _grouped_gemm_kernel(a_ptr, w_ptr, c_ptr, weights_ptr, sorted_pairs_ptr, block_expert_ptr, num_padded_ptr,
                         N, K, num_pairs, num_blocks_m, stride_a, stride_we, stride_wn, stride_c, rows_per_a: tl.constexpr,
                         MUL_WEIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    """C[pair, n] = A[pair // rows_per_a, :] . W[expert, n, :] (times the pair's routing weight). Programs
    walk GROUP_M row blocks down a column of W tiles before the next column, so tiles are reused in L2."""
    pid = tl.program_id(0)
    num_blocks_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_blocks_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_blocks_n)) % group_size
    pid_n = (pid % (GROUP_M * num_blocks_n)) // group_size
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m)
    pairs = tl.load(sorted_pairs_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    rows = tl.where(valid, pairs // rows_per_a, 0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_a + offs_k[None, :]
    w_ptrs = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None]
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


@dataclass(frozen=True)
class Tiles:
    """One launch configuration of the grouped GEMM."""

    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3


# Chosen from the sweep of benchmarks/scripts/moe_kernel.py on one H200 at Qwen3-30B-A3B's sizes (hidden 2048,
# 128 experts of intermediate 768, top-8, bf16; benchmarks/results/moe_h200/moe_kernel_sweep_1fbf5f7.json): by (token, slot)
# pairs in the batch, (most pairs, gate_up tiles, down tiles), block_m shared and best for the two together.
TILES: list[tuple[int, Tiles, Tiles]] = [
    (8, Tiles(16, 64, 128), Tiles(16, 64, 128)),
    (512, Tiles(16, 64, 128), Tiles(16, 128, 128)),
    (2048, Tiles(32, 128, 128), Tiles(32, 128, 128)),
    (8192, Tiles(64, 128, 64, group_m=8), Tiles(64, 128, 64, group_m=8)),
    (1 << 62, Tiles(128, 128, 64, group_m=8), Tiles(128, 128, 64, group_m=8)),
]


def choose_tiles(num_pairs: int) -> tuple[Tiles, Tiles]:
    """The (gate_up, down) tiles for a batch of ``num_pairs`` (token, slot) pairs."""
    return next((gate_up, down) for most, gate_up, down in TILES if num_pairs <= most)


def _grouped_gemm(a, w, c, topk_weights, sorted_pairs, block_expert, num_padded, rows_per_a: int, mul_weight: bool,
                  tiles: Tiles) -> None:
    num_experts, n, k = w.shape
    num_blocks_m = triton.cdiv(sorted_pairs.numel(), tiles.block_m)
    grid = (num_blocks_m * triton.cdiv(n, tiles.block_n),)
    _grouped_gemm_kernel[grid](a, w, c, topk_weights, sorted_pairs, block_expert, num_padded, n, k, c.shape[0],
                               num_blocks_m, a.stride(0), w.stride(0), w.stride(1), c.stride(0), rows_per_a=rows_per_a,
                               MUL_WEIGHT=mul_weight, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k,
                               GROUP_M=tiles.group_m, num_warps=tiles.num_warps, num_stages=tiles.num_stages)


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, tiles: tuple[Tiles, Tiles] | None = None, experts_elsewhere: bool = False) -> torch.Tensor:
    """As ``fused_moe_ref``: hidden ``[T, H]``, w13 ``[E, 2I, H]``, w2 ``[E, H, I]``, topk ``[T, k]``.
    ``tiles``: (gate_up, down) launch configurations, by default ``choose_tiles``'; both must share block_m.
    ``experts_elsewhere``: some ids (>= E) are experts other ranks hold (expert parallelism)."""
    num_tokens, top_k = topk_ids.shape
    pairs = num_tokens * top_k
    gate_up_tiles, down_tiles = tiles or choose_tiles(pairs)
    if gate_up_tiles.block_m != down_tiles.block_m:
        raise ValueError(f"gate_up and down tiles must share block_m ({gate_up_tiles.block_m} != {down_tiles.block_m})")
    hidden, w13, w2 = hidden.contiguous(), w13.contiguous(), w2.contiguous()
    sorted_pairs, block_expert, num_padded = align_by_expert(topk_ids, w13.shape[0], gate_up_tiles.block_m)
    gate_up = torch.empty(pairs, w13.shape[1], dtype=hidden.dtype, device=hidden.device)
    _grouped_gemm(hidden, w13, gate_up, topk_weights, sorted_pairs, block_expert, num_padded, top_k, False, gate_up_tiles)
    act = silu_and_mul(gate_up)
    # A pair of an expert held elsewhere is never written, so it must add zero; otherwise every row is written.
    down = (torch.zeros if experts_elsewhere else torch.empty)(pairs, w2.shape[1], dtype=hidden.dtype, device=hidden.device)
    weights = topk_weights.contiguous().view(-1)
    _grouped_gemm(act, w2, down, weights, sorted_pairs, block_expert, num_padded, 1, True, down_tiles)
    return down.view(num_tokens, top_k, -1).sum(dim=1)
