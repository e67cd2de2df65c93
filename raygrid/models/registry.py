"""Which model class serves which Hugging Face ``architectures`` entry."""

from __future__ import annotations

from torch import nn

from raygrid.models.llama import LlamaForCausalLM
from raygrid.models.qwen3 import Qwen3ForCausalLM
from raygrid.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
}


def resolve_model_class(hf_config) -> type[nn.Module]:
    architectures = getattr(hf_config, "architectures", None) or []
    for arch in architectures:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(
        f"config.json architectures {architectures} are not supported; raygrid supports {sorted(MODEL_REGISTRY)}"
    )
