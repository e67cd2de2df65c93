"""RMSNorm with an optional fused residual add, computed as Hugging Face does (float32 inside)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Without ``residual``: the normalized ``x``. With it: ``(norm(x + residual), x + residual)``,
        the second being the new residual stream."""
        if residual is not None:
            x = x + residual
            residual = x
        out = rms_norm_ref(x, self.weight, self.eps)
        return out if residual is None else (out, residual)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)
