"""Torch references of the elementwise hot paths (the definitions the Triton kernels are tested against),
computed as Hugging Face transformers computes them, so the CPU path matches it exactly."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
