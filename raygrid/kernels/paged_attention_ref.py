"""Torch reference of paged attention and of storing K/V into the paged cache.

The KV cache of one layer is one tensor ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
(index 0 keys, 1 values). A request's keys are found through its block table. The query tokens of a
step are packed: request ``b`` owns rows ``query_start_loc[b]:query_start_loc[b+1]``, which are the
*last* tokens of its ``seq_lens[b]`` tokens, so prefill, chunked prefill with a cached prefix, and
decode are one case.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raygrid.kernels.elementwise_ref import FP8, to_fp8_ref


def store_kv_ref(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value ``[T, kv_heads, head_dim]`` into the cache slots; a slot of -1 is padding. A float8 cache
    (unit scales) takes the values rounded to nearest, saturated at +-448."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    keys = kv_cache[0].view(-1, num_kv_heads, head_dim)
    values = kv_cache[1].view(-1, num_kv_heads, head_dim)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    for cache, new in ((keys, key[valid]), (values, value[valid])):
        if kv_cache.dtype == FP8:  # stored as bytes: index_copy_ has no float8 kernel on CPU
            cache.view(torch.uint8).index_copy_(0, slots, to_fp8_ref(new).view(torch.uint8))
        else:
            cache.index_copy_(0, slots, new.to(kv_cache.dtype))


def paged_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: list[int],
    query_start_loc: list[int],
    scale: float,
) -> torch.Tensor:
    """Causal attention of packed queries ``[T, num_heads, head_dim]`` over each request's cached K/V."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    block_size = kv_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    out = torch.empty_like(query)
    for b, seq_len in enumerate(seq_lens):
        start, end = query_start_loc[b], query_start_loc[b + 1]
        num_query = end - start
        if num_query == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        blocks = block_tables[b, :num_blocks]
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        q = query[start:end].transpose(0, 1)  # [heads, q, d]
        k = k.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        v = v.transpose(0, 1).repeat_interleave(group, dim=0).to(q.dtype)
        # Query i sits at absolute position seq_len - num_query + i and sees keys up to there.
        q_pos = torch.arange(seq_len - num_query, seq_len, device=q.device)
        mask = torch.arange(seq_len, device=q.device)[None, :] <= q_pos[:, None]
        out[start:end] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale).transpose(0, 1)
    return out
