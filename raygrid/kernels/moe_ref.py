"""Torch references for mixture-of-experts: the top-k router and the expert computation that the fused
Triton kernel (``triton_moe.py``) must match."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def route_ref(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over the experts (in float32), then the top-k; with ``renormalize`` the k weights sum to 1.
    Returns (weights ``[T, k]`` in the logits' dtype, expert ids ``[T, k]``), as Qwen3-MoE's router."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(router_logits.dtype), ids


def fused_moe_ref(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor) -> torch.Tensor:
    """``sum_k weight[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t))`` with e = ``topk_ids[t, k]``.

    hidden ``[T, H]``; w13 ``[E, 2I, H]`` (gate rows, then up rows); w2 ``[E, H, I]``. Experts are visited
    in ascending order and their rows added into the output, as transformers' Qwen3-MoE does. An id outside
    [0, E) is an expert held elsewhere (expert parallelism): its pair contributes nothing."""
    out = torch.zeros_like(hidden)
    for expert in torch.unique(topk_ids).tolist():
        if not 0 <= expert < w13.shape[0]:
            continue
        token, slot = torch.where(topk_ids == expert)
        gate, up = F.linear(hidden[token], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, token, (y * topk_weights[token, slot, None]).to(out.dtype))
    return out


def align_by_expert_ref(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """The (token, slot) pairs grouped by expert for the fused kernel. Returns ``sorted_pairs`` (pair indices
    t*k + slot in expert order, ascending within an expert, each expert's run padded to ``block_m`` with the
    invalid index T*k), ``block_expert`` (the expert of each block of ``block_m`` rows; ``num_experts`` for
    blocks past the end) and ``num_padded`` (one element: rows in use). Every shape depends only on T, k
    and the number of experts, never on the routing, so the kernel can run inside a CUDA graph."""
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
    block_expert = torch.searchsorted(ends, block_starts, right=True).to(torch.int32)
    return sorted_pairs, block_expert, ends[-1:].to(torch.int32)
