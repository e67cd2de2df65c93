"""Torch references of the elementwise hot paths (the definitions the Triton kernels are tested against),
computed as Hugging Face transformers computes them, so the CPU path matches it exactly."""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8 = torch.float8_e4m3fn  # the FP8 weights' and the FP8 KV cache's type
FP8_MAX = torch.finfo(FP8).max  # 448


MIN_SCALE = 1e-12  # an all-zero row or token keeps a finite scale


def to_fp8_ref(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float8 e4m3: rounded to nearest even, saturated at +-448 (torch's cast alone makes NaN beyond)."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An FP8 layer's activations ``[M, K]`` -> (float8, float32 scale ``[M, 1]``): each token scaled by its own largest
    value. The scale is the largest value times 1/448 (what torch computes on a GPU for ``/ 448``, on every device)."""
    scale = (x.abs().amax(dim=1, keepdim=True).float() * (1.0 / FP8_MAX)).clamp(min=MIN_SCALE)
    return to_fp8_ref(x.float() / scale), scale


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def apply_rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation: the head's two halves rotate together."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up on the merged gate_up projection's output ``[T, 2n]``."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
