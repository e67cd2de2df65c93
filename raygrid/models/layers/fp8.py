"""FP8 weights (``quantization="fp8"``, as vLLM names it): the dense linear layers keep their weights in
float8 e4m3 with one float32 scale per output channel, and their inputs are quantized per token on the fly.
The embedding, the LM head and the norms stay in the model's dtype.

Weights come either from a bf16/fp32 checkpoint, quantized once after loading, or from an FP8 checkpoint in the
compressed-tensors layout that vLLM reads (``quantization_config`` with ``quant_method: compressed-tensors``,
float weights of 8 bits, a scale per channel or per tensor, dynamic per-token activations).

``fp8_linear_ref`` defines what an FP8 layer computes (its activations quantized by
``kernels/elementwise_ref.quantize_per_token``); ``kernels/ops.linear`` runs it (``torch._scaled_mm`` on a GPU).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from raygrid.kernels.elementwise_ref import FP8, FP8_MAX, MIN_SCALE, quantize_per_token, to_fp8_ref
from raygrid.parallel.layers import ColumnParallelLinear, RowParallelLinear


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight [N, K]`` -> (float8 weight, float32 scale ``[N]``) with ``weight ~ fp8 * scale[:, None]``."""
    scale = (weight.abs().amax(dim=1).float() / FP8_MAX).clamp(min=MIN_SCALE)
    return to_fp8_ref(weight.float() / scale[:, None]), scale


def fp8_linear_ref(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight * weight_scale).T + bias`` with ``x`` quantized per token to float8 first, in float32."""
    x_q, x_scale = quantize_per_token(x.reshape(-1, x.shape[-1]))
    y = fp8_product_ref(x_q, x_scale, weight, weight_scale, bias, x.dtype)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def fp8_product_ref(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                    bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The FP8 layer's product of an input quantized already (``x_q [M, K]`` float8, ``x_scale [M, 1]``), in ``dtype``."""
    y = (x_q.float() * x_scale) @ (weight.float() * weight_scale[:, None]).T
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


# ---------------------------------------------------------------------------- the model's layers


def fp8_layers(model: nn.Module) -> list[nn.Module]:
    """The layers FP8 applies to: the tensor-parallel linear layers (attention and dense MLP projections)."""
    return [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def quantize_model(model: nn.Module) -> None:
    """After a bf16/fp32 checkpoint is loaded: every FP8 layer's weight becomes float8 with per-channel scales."""
    for layer in fp8_layers(model):
        weight, scale = quantize_per_channel(layer.weight.data)
        layer.weight = nn.Parameter(weight, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)


def prepare_for_fp8_checkpoint(model: nn.Module) -> None:
    """Before an FP8 checkpoint is loaded: float8 weights and float32 per-channel scales in place, each loaded by the
    layer's own sharding (a per-tensor scale is spread over the rows of its part)."""
    for layer in fp8_layers(model):
        loader = layer.weight.weight_loader
        layer.weight = nn.Parameter(torch.empty_like(layer.weight.data, dtype=FP8), requires_grad=False)
        layer.weight.weight_loader = loader
        layer.weight_scale = nn.Parameter(torch.ones(layer.weight.shape[0], dtype=torch.float32, device=layer.weight.device),
                                          requires_grad=False)
        layer.weight_scale.weight_loader = _scale_loader(layer, loader)


def _scale_loader(layer: nn.Module, weight_loader):
    def load(param: nn.Parameter, loaded, shard_id=None) -> None:
        if isinstance(layer, RowParallelLinear):  # split along K: every rank holds every output channel's scale
            param.data.copy_(_ChannelScale(loaded).narrow(0, 0, param.shape[0]))
        elif shard_id is None:
            weight_loader(param, _ChannelScale(loaded))
        else:
            weight_loader(param, _ChannelScale(loaded), shard_id)

    return load


class _ChannelScale:
    """A checkpoint scale seen as one value per output channel: ``[N]`` or ``[N, 1]`` as it is, a per-tensor
    scale repeated over whatever rows are asked for."""

    def __init__(self, loaded) -> None:
        self.loaded = loaded
        self.per_tensor = math.prod(loaded.shape) == 1

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        if self.per_tensor:  # shape [1], [1, 1] or a scalar (CheckpointTensor reads a scalar whole)
            return self.loaded.narrow(0, 0, 1).float().reshape(1).expand(size)
        return self.loaded.narrow(0, start, size).float().reshape(size)


# ---------------------------------------------------------------------------- the checkpoint's word


def resolve_quantization(requested: str | None, hf_config) -> str | None:
    """The quantization an engine runs: the checkpoint's (an FP8 compressed-tensors ``quantization_config``), or the
    one asked for on an unquantized checkpoint. A layout raygrid cannot run fails here, naming the field."""
    qc = getattr(hf_config, "quantization_config", None)
    experts = getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0)
    if qc is None:
        if requested == "fp8" and experts:
            raise ValueError("quantization: 'fp8' covers dense models for now; this model's experts have no FP8 kernel yet")
        return requested
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise ValueError(f"quantization_config.quant_method: {method!r} checkpoints are not supported "
                         "(raygrid reads FP8 checkpoints in the compressed-tensors layout)")
    if experts:
        raise ValueError("quantization_config: FP8 checkpoints of mixture-of-experts models are not supported yet")
    if not qc.get("config_groups"):
        raise ValueError("quantization_config.config_groups: none given (an FP8 checkpoint describes its weights there)")
    if qc.get("kv_cache_scheme"):
        raise ValueError("quantization_config.kv_cache_scheme: calibrated KV cache scales are not supported "
                         "(kv_cache_dtype='fp8' stores keys and values with unit scales)")
    for name, group in qc["config_groups"].items():
        _check_group(f"quantization_config.config_groups.{name}", group)
    return "fp8"


def _check_group(where: str, group: dict) -> None:
    weights = group.get("weights") or {}
    wanted = {"num_bits": 8, "type": "float"}
    for key, value in wanted.items():
        if weights.get(key) != value:
            raise ValueError(f"{where}.weights.{key}: raygrid runs {value!r} FP8 weights (got {weights.get(key)!r})")
    if weights.get("strategy") not in ("channel", "tensor"):
        raise ValueError(f"{where}.weights.strategy: 'channel' or 'tensor' scales are supported (got {weights.get('strategy')!r})")
    if weights.get("symmetric", True) is not True:
        raise ValueError(f"{where}.weights.symmetric: only symmetric FP8 weights are supported (got {weights.get('symmetric')!r})")
    activations = group.get("input_activations")
    if activations is not None:
        if activations.get("dynamic") is not True:
            raise ValueError(f"{where}.input_activations.dynamic: only dynamic activation scales are supported "
                             f"(got {activations.get('dynamic')!r})")
        if activations.get("strategy", "token") != "token":
            raise ValueError(f"{where}.input_activations.strategy: activations are quantized per token "
                             f"(got {activations.get('strategy')!r})")
