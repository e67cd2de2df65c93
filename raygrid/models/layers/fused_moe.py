"""A sparse mixture-of-experts block: a replicated router picks each token's top-k experts, and the
experts run as one fused kernel (``ops.fused_moe``).

Under tensor parallelism every rank holds every expert, with each expert's intermediate dimension split
like a dense MLP's (gate/up by rows, down by columns); the partial outputs are summed by one all-reduce.

Weights load from either checkpoint layout: one tensor per expert (``experts.{e}.gate_proj / up_proj /
down_proj``, as published checkpoints and transformers' ``save_pretrained`` write them), or packed
(``experts.gate_up_proj`` ``[E, 2I, H]`` and ``experts.down_proj`` ``[E, H, I]``, as recent transformers
holds them in memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raygrid.kernels import ops
from raygrid.kernels.moe_ref import route_ref
from raygrid.parallel.groups import get_tp_group


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class FusedExperts(nn.Module):
    """``w13`` ``[E, 2 * I / tp, H]`` (this rank's gate rows, then its up rows) and ``w2`` ``[E, H, I / tp]``."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.tp = get_tp_group()
        if intermediate_size % self.tp.world_size:
            raise ValueError(f"moe_intermediate_size ({intermediate_size}) is not divisible by tensor_parallel_size ({self.tp.world_size})")
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.per_rank = intermediate_size // self.tp.world_size
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.per_rank, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.per_rank), requires_grad=False)
        self.w13.weight_loader = self.w2.weight_loader = self.load_shard

    def shard_ids(self, param_name: str) -> list:
        """What a complete load of ``param_name`` ("w13" or "w2") consists of, one id per expert and part."""
        parts = ("gate", "up") if param_name == "w13" else ("down",)
        return [(expert, part) for expert in range(self.num_experts) for part in parts]

    def load_shard(self, param: nn.Parameter, loaded, shard_id) -> None:
        """``shard_id``: (expert, "gate" | "up" | "down") for one expert's tensor, or "gate_up" / "down" for
        the packed tensors of every expert."""
        n, start = self.per_rank, self.tp.rank_in_group * self.per_rank
        if shard_id == "gate_up":  # [E, 2I, H]
            param.data[:, :n].copy_(loaded.narrow(1, start, n))
            param.data[:, n:].copy_(loaded.narrow(1, self.intermediate_size + start, n))
        elif shard_id == "down":  # [E, H, I]
            param.data.copy_(loaded.narrow(2, start, n))
        else:
            expert, part = shard_id
            if part == "down":  # [H, I]
                param.data[expert].copy_(loaded.narrow(1, start, n))
            else:  # [I, H]
                param.data[expert].narrow(0, 0 if part == "gate" else n, n).copy_(loaded.narrow(0, start, n))

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(ops.fused_moe(hidden, self.w13, self.w2, topk_weights, topk_ids))


class SparseMoeBlock(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        self.top_k = hf_config.num_experts_per_tok
        self.renormalize = bool(getattr(hf_config, "norm_topk_prob", True))
        self.gate = Router(hf_config.num_experts, hf_config.hidden_size)
        self.experts = FusedExperts(hf_config.num_experts, hf_config.hidden_size, hf_config.moe_intermediate_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = route_ref(self.gate(hidden), self.top_k, self.renormalize)
        return self.experts(hidden, topk_weights, topk_ids)
