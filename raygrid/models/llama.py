"""Llama-family decoder (Llama 2/3, and with per-head q/k RMSNorm, Qwen3) on packed tokens.

Projections are merged (q/k/v into qkv_proj, gate/up into gate_up_proj) and tensor-parallel; with
pipeline parallelism a rank builds only its stage's layers (the embedding on the first stage, the
final norm and LM head on the last) and reads only their tensors from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from raygrid.kernels import ops
from raygrid.models.layers.attention import Attention, AttentionMetadata
from raygrid.models.layers.rms_norm import RMSNorm
from raygrid.models.layers.rotary import RotaryEmbedding
from raygrid.parallel.groups import get_pp_group
from raygrid.parallel.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)

# Hugging Face tensor name part -> (our parameter name part, shard id) for the merged projections.
STACKED_PARAMS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", "q"),
    "self_attn.k_proj": ("self_attn.qkv_proj", "k"),
    "self_attn.v_proj": ("self_attn.qkv_proj", "v"),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def head_dim_of(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def stage_layers(num_layers: int, stage: int, num_stages: int) -> range:
    """The layers of one pipeline stage: an even split, the first stages taking one more if needed."""
    base, extra = divmod(num_layers, num_stages)
    if base == 0:
        raise ValueError(f"pipeline_parallel_size ({num_stages}) exceeds num_hidden_layers ({num_layers})")
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class DecoderAttention(nn.Module):
    def __init__(self, hf_config, qk_norm: bool) -> None:
        super().__init__()
        self.head_dim = head_dim_of(hf_config)
        num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
        bias = getattr(hf_config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(hf_config.hidden_size, self.head_dim, hf_config.num_attention_heads, num_kv_heads, bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(hf_config.num_attention_heads * self.head_dim, hf_config.hidden_size, bias)
        self.q_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, hf_config.rms_norm_eps) if qk_norm else None
        self.rotary = RotaryEmbedding(hf_config, self.head_dim, hf_config.max_position_embeddings)
        self.attn = Attention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5)

    @property
    def takes_fp8_input(self) -> bool:
        """FP8 weights: the norm before hands its output over quantized (``ops.Fp8Activation``)."""
        return self.qkv_proj.weight_scale is not None

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata) -> torch.Tensor | ops.Fp8Product:
        qkv = self.qkv_proj(hidden, defer_scale=True)
        scales = None  # an FP8 product's, applied by the rotary kernel (q and k as it rotates them, v in place)
        if isinstance(qkv, ops.Fp8Product):
            qkv, scales = qkv.values, (qkv.x_scale, qkv.weight_scale)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: per-head norms, fused with the rotation
            q, k = ops.qk_norm_rotary(positions, q, k, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps,
                                      self.rotary.cos_cache, self.rotary.sin_cache, v, scales)
        else:
            q, k = self.rotary(positions, q, k, v, scales)
        return self.o_proj(self.attn(q, k, v, kv_cache, meta), defer_scale=True)  # scaled by the norm after


class DecoderMLP(nn.Module):
    def __init__(self, hf_config) -> None:
        super().__init__()
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only 'silu')")
        bias = getattr(hf_config, "mlp_bias", False)
        inter = hf_config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(hf_config.hidden_size, [inter, inter], bias)
        self.down_proj = RowParallelLinear(inter, hf_config.hidden_size, bias)

    @property
    def takes_fp8_input(self) -> bool:
        """FP8 weights: the norm before hands its output over quantized, and so does SiLU-and-mul to down_proj."""
        return self.gate_up_proj.weight_scale is not None

    def forward(self, x: torch.Tensor | ops.Fp8Activation) -> torch.Tensor | ops.Fp8Product:
        """down_proj's FP8 product (small batches) is scaled by the next norm. gate_up_proj's is scaled by a launch of
        its own: SiLU-and-mul holds a whole row in registers, and with the row's weight scales beside them it took
        19.8 against 11.1 us a call on the 8B shape, more than the 6.0 us launch it saved (benchmarks/README.md)."""
        gate_up = self.gate_up_proj(x)
        return self.down_proj(ops.silu_and_mul(gate_up, fp8=self.down_proj.weight_scale is not None), defer_scale=True)


class DecoderLayer(nn.Module):
    def __init__(self, hf_config, qk_norm: bool, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = DecoderAttention(hf_config, qk_norm)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps)

    def forward(self, positions, hidden, residual, kv_cache, meta):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden, fp8=self.self_attn.takes_fp8_input)
        else:
            hidden, residual = self.input_layernorm(hidden, residual, fp8=self.self_attn.takes_fp8_input)
        hidden = self.self_attn(positions, hidden, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual, fp8=self.mlp.takes_fp8_input)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    qk_norm = False

    def __init__(self, hf_config) -> None:
        super().__init__()
        self.config = hf_config
        pp = get_pp_group()
        self.is_first_stage, self.is_last_stage = pp.is_first, pp.is_last
        self.layer_range = stage_layers(hf_config.num_hidden_layers, pp.rank_in_group, pp.world_size)
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        self.embed_tokens = VocabParallelEmbedding(hf_config.vocab_size, hf_config.hidden_size) if self.is_first_stage else None
        self.layers = nn.ModuleList(DecoderLayer(hf_config, self.qk_norm, self.make_mlp(hf_config, i)) for i in self.layer_range)
        self.norm = RMSNorm(hf_config.hidden_size, hf_config.rms_norm_eps) if self.is_last_stage else None
        self.lm_head = None
        if self.is_last_stage and not (self.tie_word_embeddings and self.is_first_stage):
            self.lm_head = ParallelLMHead(hf_config.vocab_size, hf_config.hidden_size)

    def make_mlp(self, hf_config, layer_index: int) -> nn.Module:
        """The feed-forward block of a layer (a mixture-of-experts model picks per layer)."""
        return DecoderMLP(hf_config)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[torch.Tensor],
        meta: AttentionMetadata,
        intermediate: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        """Final hidden states ``[T, hidden]`` on the last stage; elsewhere ``(hidden, residual)`` for the
        next stage. Stages after the first start from the previous stage's ``intermediate``."""
        if self.is_first_stage:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
        if not self.is_last_stage:
            return ops.scaled(hidden), residual
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        head = self.lm_head if self.lm_head is not None else self.embed_tokens
        return head.compute_logits(hidden)

    # ------------------------------------------------------------------ checkpoint loading

    def _local_name(self, hf_name: str) -> str | None:
        """The checkpoint name without "model.", its layer index made this stage's (None: another stage's layer)."""
        name = hf_name.removeprefix("model.")
        if name.startswith("layers."):
            index = int(name.split(".")[1])
            if index not in self.layer_range:
                return None
            name = f"layers.{index - self.layer_range.start}." + name.split(".", 2)[2]
        return name

    def _our_name(self, hf_name: str) -> tuple[str | None, object]:
        """Our parameter for a checkpoint tensor (None: not on this rank), and the shard id."""
        name = self._local_name(hf_name)
        if name is None or "rotary_emb.inv_freq" in name:
            return None, None
        if (name == "lm_head.weight" and self.lm_head is None) or (name.startswith("norm.") and self.norm is None):
            return None, None  # belongs to another pipeline stage (or is tied)
        if name == "embed_tokens.weight" and self.embed_tokens is None:
            # A tied last stage that is not also the first takes its LM head from the embedding.
            return ("lm_head.weight", None) if self.tie_word_embeddings and self.lm_head is not None else (None, None)
        for hf_part, (ours, shard_id) in STACKED_PARAMS.items():
            if f".{hf_part}." in name:
                return name.replace(hf_part, ours), shard_id
        return name, None

    def load_weights(self, weights: Iterable) -> set[str]:
        """Copy (this rank's shard of) each checkpoint tensor into our parameters; returns what was filled."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name, shard_id = self._our_name(hf_name)
            if name is None:
                continue
            if name not in params:
                raise ValueError(f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}")
            param = params[name]
            is_fp8 = getattr(tensor, "is_fp8", False)
            if is_fp8 != (param.dtype == torch.float8_e4m3fn):
                raise ValueError(f"checkpoint tensor {hf_name!r} is {'' if is_fp8 else 'not '}FP8, "
                                 f"but raygrid's {name} is {param.dtype} (quantization_config's 'ignore' list and raygrid's "
                                 "FP8 layers disagree)")
            loader = getattr(param, "weight_loader", None)
            try:
                if loader is not None:
                    loader(param, tensor, shard_id) if shard_id is not None else loader(param, tensor)
                else:
                    param.data.copy_(tensor.narrow(0, 0, tensor.shape[0]))
            except RuntimeError as error:
                raise ValueError(f"checkpoint tensor {hf_name!r} of shape {tensor.shape} does not fit {name}: {error}") from None
            loaded.add(name if shard_id is None else f"{name}[{shard_id}]")
        return loaded

    def expected_loads(self) -> set[str]:
        """What ``load_weights`` must have filled for this rank's part of the model to be complete."""
        expected = set()
        for name, _ in self.named_parameters():
            shards = [f"{name}[{sid}]" for ours, sid in STACKED_PARAMS.values() if name.rsplit(".", 1)[0].endswith(ours)]
            expected.update(shards or [name])
        return expected
