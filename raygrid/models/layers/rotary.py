"""Rotary position embedding (NeoX style: the head's two halves rotate together), with the
frequency schedules of Hugging Face's rope types so that results match transformers exactly."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from raygrid.kernels import ops

# Rope types whose frequencies depend on the running sequence length are not supported.
_UNSUPPORTED = {"dynamic", "longrope"}


def rope_frequencies(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling for the checkpoint's rope parameters."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type in _UNSUPPORTED:
        raise ValueError(f"rope_parameters.rope_type {rope_type!r} is not supported (supported: default, linear, llama3, yarn)")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        return inv_freq, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_parameters.rope_type {rope_type!r} is unknown")
    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"))


class RotaryEmbedding(nn.Module):
    def __init__(self, hf_config, head_dim: int, max_position: int) -> None:
        super().__init__()
        device = torch.get_default_device()  # the model may be built under a device context
        with torch.device("cpu"):  # transformers' rope functions compute on the CPU
            inv_freq, scaling = rope_frequencies(hf_config, head_dim)
            positions = torch.arange(max_position, dtype=torch.float32)
            freqs = positions[:, None] * inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cache", (emb.cos() * scaling).to(device), persistent=False)
        self.register_buffer("sin_cache", (emb.sin() * scaling).to(device), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None,
                product_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q ``[T, heads, d]`` and k ``[T, kv_heads, d]`` to their token positions ``[T]`` (``v`` and
        ``product_scales``: the slices of an FP8 qkv product, scaled too, as ``ops.rotary`` takes them)."""
        return ops.rotary(positions, q, k, self.cos_cache, self.sin_cache, v, product_scales)

