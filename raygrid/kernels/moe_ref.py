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
    in ascending order and their rows added into the output, as transformers' Qwen3-MoE does."""
    out = torch.zeros_like(hidden)
    for expert in torch.unique(topk_ids).tolist():
        token, slot = torch.where(topk_ids == expert)
        gate, up = F.linear(hidden[token], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, token, (y * topk_weights[token, slot, None]).to(out.dtype))
    return out
