"""Qwen3-MoE: Qwen3's decoder with a sparse mixture-of-experts block in place of the MLP on the layers that
``decoder_sparse_step`` and ``mlp_only_layers`` select (a dense MLP of ``intermediate_size`` elsewhere)."""

from __future__ import annotations

import re

from torch import nn

from raygrid.models.layers.fused_moe import SparseMoeBlock
from raygrid.models.llama import DecoderMLP
from raygrid.models.qwen3 import Qwen3ForCausalLM

# experts.{e}.gate_proj.weight -> (w13, (e, "gate")); experts.gate_up_proj -> (w13, "gate_up"); ...
_PER_EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_PACKED = re.compile(r"\.mlp\.experts\.(gate_up|down)_proj$")


def is_sparse_layer(hf_config, layer_index: int) -> bool:
    return (layer_index not in (getattr(hf_config, "mlp_only_layers", None) or [])
            and hf_config.num_experts > 0 and (layer_index + 1) % hf_config.decoder_sparse_step == 0)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, hf_config, layer_index: int) -> nn.Module:
        return SparseMoeBlock(hf_config) if is_sparse_layer(hf_config, layer_index) else DecoderMLP(hf_config)

    def _our_name(self, hf_name: str):
        per_expert, packed = _PER_EXPERT.search(hf_name), _PACKED.search(hf_name)
        if per_expert is None and packed is None:
            return super()._our_name(hf_name)
        experts = self._local_name(hf_name[: (per_expert or packed).start()] + ".mlp.experts")
        if experts is None:
            return None, None  # another pipeline stage's layer
        if per_expert is not None:
            expert, part = int(per_expert.group(1)), per_expert.group(2)
            return f"{experts}.{'w2' if part == 'down' else 'w13'}", (expert, part)
        part = packed.group(1)
        return f"{experts}.{'w13' if part == 'gate_up' else 'w2'}", part

    def load_weights(self, weights) -> set[str]:
        loaded = super().load_weights(weights)
        for key in [k for k in loaded if k.endswith(("[gate_up]", "[down]"))]:  # a packed tensor fills every expert
            name = key.split("[", 1)[0]
            loaded.discard(key)
            loaded.update(self._expert_loads(name))
        return loaded

    def expected_loads(self) -> set[str]:
        expected = set()
        for name in super().expected_loads():
            is_expert_weight = name.endswith((".experts.w13", ".experts.w2"))
            expected.update(self._expert_loads(name) if is_expert_weight else [name])
        return expected

    def _expert_loads(self, name: str) -> list[str]:
        module_name, param = name.rsplit(".", 1)
        return [f"{name}[{shard}]" for shard in self.get_submodule(module_name).shard_ids(param)]
