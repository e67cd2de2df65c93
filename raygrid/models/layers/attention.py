"""Paged attention over the KV cache, and the metadata each forward pass carries for it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from raygrid.kernels import ops


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each request attends to."""

    slot_mapping: torch.Tensor  # [T] int64 cache slot of each token (-1: padding)
    block_tables: torch.Tensor  # [B, max_blocks] int32/64
    seq_lens: list[int]  # [B] tokens in each request's context after this step
    query_start_loc: list[int]  # [B + 1] packed query rows of each request
    max_query_len: int
    max_seq_len: int
    # The same on the device, for the kernels (and CUDA graphs, which cannot read Python lists).
    seq_lens_tensor: torch.Tensor | None = None  # [B] int32
    query_start_loc_tensor: torch.Tensor | None = None  # [B + 1] int32

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1


class Attention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """q ``[T, heads, d]``, k/v ``[T, kv_heads, d]`` -> ``[T, heads * d]``."""
        ops.store_kv(k, v, kv_cache, meta.slot_mapping)
        out = ops.paged_attention(q, kv_cache, meta, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
