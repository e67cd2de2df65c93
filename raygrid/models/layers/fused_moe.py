"""A sparse mixture-of-experts block: a replicated router picks each token's top-k experts, and the
experts run as one fused kernel (``ops.fused_moe``).

Under tensor parallelism every rank holds every expert, with each expert's intermediate dimension split
like a dense MLP's (gate/up by rows, down by columns); the partial outputs are summed by one all-reduce.
Under expert parallelism each rank of the EP group holds whole experts, some of them; the tokens of every
DP rank are gathered, routed and sent back summed (``parallel/expert_parallel.py``).

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
from raygrid.parallel.eplb import ExpertMap
from raygrid.parallel.expert_parallel import AllGatherDispatcher
from raygrid.parallel.groups import get_parallel_state


class Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)


class FusedExperts(nn.Module):
    """``w13`` ``[slots, 2 * I', H]`` (each slot's gate rows, then its up rows) and ``w2`` ``[slots, H, I']``.

    Replicated (the default): a slot per expert on every rank, each expert's intermediate dimension split
    over TP (I' = I / tp). Under expert parallelism: ``num_experts + num_redundant_experts`` slots split over
    the EP group, whole experts (I' = I), placed by ``map`` (an ``ExpertMap``)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        state = get_parallel_state()
        self.tp, self.ep = state.tp, state.ep
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.map: ExpertMap | None = None
        if self.ep is None:
            if intermediate_size % self.tp.world_size:
                raise ValueError(f"moe_intermediate_size ({intermediate_size}) is not divisible by tensor_parallel_size ({self.tp.world_size})")
            self.per_rank, self.shard_start = intermediate_size // self.tp.world_size, self.tp.rank_in_group * (intermediate_size // self.tp.world_size)
            slots = num_experts
        else:
            num_physical = num_experts + state.num_redundant_experts
            if num_physical % self.ep.world_size:
                raise ValueError(f"num_experts + num_redundant_experts ({num_experts} + {state.num_redundant_experts}) is not "
                                 f"divisible by the expert-parallel size (DP x TP = {self.ep.world_size})")
            self.per_rank, self.shard_start = intermediate_size, 0
            self.map = ExpertMap(num_experts, num_physical, self.ep, state.eplb_window_size)
            slots = self.map.slots
        self.w13 = nn.Parameter(torch.empty(slots, 2 * self.per_rank, hidden_size), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(slots, hidden_size, self.per_rank), requires_grad=False)
        self.w13.weight_loader = self.w2.weight_loader = self.load_shard

    def shard_ids(self, param_name: str) -> list:
        """What a complete load of ``param_name`` ("w13" or "w2") consists of, one id per expert and part."""
        parts = ("gate", "up") if param_name == "w13" else ("down",)
        return [(expert, part) for expert in range(self.num_experts) for part in parts]

    def _slots(self) -> list[tuple[int, int]]:
        """(slot, logical expert) of each of this rank's slots."""
        return list(enumerate(self.map.local_experts() if self.map is not None else range(self.num_experts)))

    def load_shard(self, param: nn.Parameter, loaded, shard_id) -> None:
        """``shard_id``: (expert, "gate" | "up" | "down") for one expert's tensor, or "gate_up" / "down" for
        the packed tensors of every expert. An expert this rank holds no slot of is skipped."""
        n, start = self.per_rank, self.shard_start
        if shard_id in ("gate_up", "down"):  # [E, 2I, H] / [E, H, I]
            for slot, expert in self._slots():
                one = loaded.narrow(0, expert, 1)[0]
                if shard_id == "down":
                    param.data[slot].copy_(one.narrow(1, start, n))
                else:
                    param.data[slot, :n].copy_(one.narrow(0, start, n))
                    param.data[slot, n:].copy_(one.narrow(0, self.intermediate_size + start, n))
            return
        expert, part = shard_id
        for slot in [slot for slot, e in self._slots() if e == expert]:
            if part == "down":  # [H, I]
                param.data[slot].copy_(loaded.narrow(1, start, n))
            else:  # [I, H]
                param.data[slot].narrow(0, 0 if part == "gate" else n, n).copy_(loaded.narrow(0, start, n))

    def forward(self, hidden: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """Replicated experts: every token through its experts' shards on this rank, summed over TP."""
        return self.tp.all_reduce(ops.fused_moe(hidden, self.w13, self.w2, topk_weights, topk_ids))

    def forward_local(self, tokens: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Expert parallelism: the contributions of this rank's slots to every gathered token (the pairs that
        other ranks' slots serve contribute nothing here)."""
        return ops.fused_moe(tokens, self.w13, self.w2, topk_weights, self.map.to_local(topk_ids, valid), experts_elsewhere=True)


class SparseMoeBlock(nn.Module):
    takes_fp8_input = False  # the experts stay in the model's dtype under quantization="fp8"

    def __init__(self, hf_config) -> None:
        super().__init__()
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        self.top_k = hf_config.num_experts_per_tok
        self.renormalize = bool(getattr(hf_config, "norm_topk_prob", True))
        self.gate = Router(hf_config.num_experts, hf_config.hidden_size)
        self.experts = FusedExperts(hf_config.num_experts, hf_config.hidden_size, hf_config.moe_intermediate_size)
        self.dispatcher = AllGatherDispatcher() if self.experts.ep is not None else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.dispatcher is None:
            topk_weights, topk_ids = route_ref(self.gate(hidden), self.top_k, self.renormalize)
            return self.experts(hidden, topk_weights, topk_ids)
        tokens, valid = self.dispatcher.dispatch(hidden)
        topk_weights, topk_ids = route_ref(self.gate(tokens), self.top_k, self.renormalize)
        return self.dispatcher.combine(self.experts.forward_local(tokens, topk_weights, topk_ids, valid), hidden.shape[0])
