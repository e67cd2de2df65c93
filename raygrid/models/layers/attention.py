"""Paged attention over the KV cache, and the metadata each forward pass carries for it."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import torch
from torch import nn

from raygrid.kernels import ops

if TYPE_CHECKING:
    from raygrid.kernels.triton_attention import PromptLaunch


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each request attends to."""

    slot_mapping: torch.Tensor  # [T] int64 cache slot of each token (-1: padding)
    block_tables: torch.Tensor  # [B, max_blocks] int32/64
    seq_lens: list[int]  # [B] tokens in each request's context after this step
    query_start_loc: list[int]  # [B + 1] packed query rows of each request
    max_query_len: int
    # The same on the device, for the kernels (and CUDA graphs, which cannot read Python lists).
    seq_lens_tensor: torch.Tensor | None = None  # [B] int32
    query_start_loc_tensor: torch.Tensor | None = None  # [B + 1] int32
    # The rows the decode kernel runs by context length, longest first, int32 (it starts them in this order): a decode
    # step's [B], or a prompt step's leading decode rows (``prompt_launch.decode_rows``) where they have a launch of their own.
    decode_order: torch.Tensor | None = None
    # A step with prompt tokens: its leading decode rows to the decode kernel, and the prefill kernel's tiles for the
    # rest, from the batch's lengths (ops.prompt_launch_for: a GPU's steps past the mixed graphs' sizes). None: one
    # prefill launch by the batch's shapes (ops.prefill_launch), as a CUDA graph captures it.
    prompt_launch: PromptLaunch | None = None

    @property
    def decode_only(self) -> bool:
        return self.max_query_len == 1


# What attention does instead while a pass is captured in pieces (engine/piecewise_graphs.py): it receives the
# layer, q, k, v and its cache, and returns the tensor the rest of the layer reads as attention's output.
_cut: Callable | None = None


@contextmanager
def attention_cut(cut: Callable) -> Iterator[None]:
    """Within this context every Attention forward calls ``cut(attention, q, k, v, kv_cache)`` and computes nothing."""
    global _cut
    previous, _cut = _cut, cut
    try:
        yield
    finally:
        _cut = previous


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
        if _cut is not None:
            return _cut(self, q, k, v, kv_cache)
        self.store(k, v, kv_cache, meta.slot_mapping)
        return self.attend(q, kv_cache, meta)

    def store(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """This step's keys and values into their cache slots (slot -1: a padding row, not stored)."""
        ops.store_kv(k, v, kv_cache, slot_mapping)

    def attend(self, q: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, out: torch.Tensor | None = None) -> torch.Tensor:
        """Attention of q over the cache, which already holds this step's keys and values; ``out``
        (``[T, heads, d]``), when given, receives the result."""
        out = ops.paged_attention(q, kv_cache, meta, self.scale, out=out)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
