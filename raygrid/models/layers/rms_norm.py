"""RMSNorm with an optional fused residual add (float32 inside, as Hugging Face computes it)."""

from __future__ import annotations

import torch
from torch import nn

from raygrid.kernels import ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, fp8: bool = False):
        """Without ``residual``: the normalized ``x``. With it: ``(norm(x + residual), x + residual)``,
        the second being the new residual stream. ``fp8``: the norm quantized for the FP8 layer it feeds
        (``ops.Fp8Activation``)."""
        return ops.rms_norm(x, self.weight, self.eps, residual, fp8=fp8)
