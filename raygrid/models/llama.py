"""Llama-family decoder (Llama 2/3, and with per-head q/k RMSNorm, Qwen3) on packed tokens.

Projections are merged (q/k/v into qkv_proj, gate/up into gate_up_proj) so each layer runs two
matrix products fewer; ``load_weights`` splits Hugging Face's separate tensors into them.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from raygrid.models.layers.activation import silu_and_mul_ref
from raygrid.models.layers.attention import Attention, AttentionMetadata
from raygrid.models.layers.rms_norm import RMSNorm
from raygrid.models.layers.rotary import RotaryEmbedding


def head_dim_of(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


class DecoderAttention(nn.Module):
    def __init__(self, hf_config, qk_norm: bool) -> None:
        super().__init__()
        self.num_heads = hf_config.num_attention_heads
        self.num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim_of(hf_config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = getattr(hf_config, "attention_bias", False)
        self.qkv_proj = nn.Linear(hf_config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, hf_config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps) if qk_norm else None
        self.rotary = RotaryEmbedding(hf_config, self.head_dim, hf_config.max_position_embeddings)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta))


class DecoderMLP(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        bias = getattr(hf_config, "mlp_bias", False)
        self.gate_up_proj = nn.Linear(hf_config.hidden_size, 2 * hf_config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(hf_config.intermediate_size, hf_config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul_ref(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, hf_config, qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(hf_config, qk_norm)
        self.mlp = DecoderMLP(hf_config)
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)

    def forward(self, positions, hidden, residual, kv_cache, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    qk_norm = False

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        self.embed_tokens = nn.Embedding(hf_config.vocab_size, hf_config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(hf_config, self.qk_norm) for _ in range(hf_config.num_hidden_layers))
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Final hidden states ``[T, hidden]`` of the packed tokens."""
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return torch.nn.functional.linear(hidden, weight)

    # ------------------------------------------------------------------ checkpoint loading

    def _merged_slices(self) -> dict[str, tuple[str, int, int]]:
        """Hugging Face tensor suffix -> (merged parameter suffix, row offset, rows)."""
        attn = self.layers[0].self_attn
        inter = self.config.intermediate_size
        q, kv = attn.q_size, attn.kv_size
        return {
            "self_attn.q_proj": ("self_attn.qkv_proj", 0, q),
            "self_attn.k_proj": ("self_attn.qkv_proj", q, kv),
            "self_attn.v_proj": ("self_attn.qkv_proj", q + kv, kv),
            "mlp.gate_proj": ("mlp.gate_up_proj", 0, inter),
            "mlp.up_proj": ("mlp.gate_up_proj", inter, inter),
        }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy checkpoint tensors into the parameters; returns the names of the parameters filled."""
        params = dict(self.named_parameters())
        merged = self._merged_slices()
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.")
            if "rotary_emb.inv_freq" in name or (name == "lm_head.weight" and self.lm_head is None):
                continue
            offset, rows = None, None
            for hf_part, (ours, start, size) in merged.items():
                if f".{hf_part}." in name:
                    name, offset, rows = name.replace(hf_part, ours), start, size
                    break
            if name not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}")
            param = params[name]
            target = param.data if offset is None else param.data.narrow(0, offset, rows)
            if target.shape != tensor.shape:
                raise ValueError(f"checkpoint tensor {hf_name!r} has shape {tuple(tensor.shape)}, expected {tuple(target.shape)}")
            target.copy_(tensor)
            loaded.add(name if offset is None else f"{name}[{offset}]")
        return loaded

    def expected_loads(self) -> set[str]:
        """What ``load_weights`` must have filled for the model to be complete."""
        merged = self._merged_slices()
        expected = set()
        for name, _ in self.named_parameters():
            parts = [f"{name}[{start}]" for hf_part, (ours, start, _) in merged.items() if name.endswith(f"{ours}.weight") or name.endswith(f"{ours}.bias")]
            expected.update(parts or [name])
        return expected
