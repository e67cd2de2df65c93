"""Triton kernels of paged attention: storing K/V by slot mapping, decode, and prefill with a cached
prefix. Their definition is ``paged_attention_ref.py``; tests compare the two on random inputs.

Cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:  # padding token
        return
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    k = tl.load(key_ptr + t * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + t * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value ``[T, kv_heads, head_dim]`` into the cache slots; a slot of -1 is skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PAGE=k_cache.shape[1],
    )


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program per (sequence, kv head): the kv head's K/V are read once for all its query heads."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kvh * QUERIES_PER_KV + groups
    qmask = (groups[:, None] < QUERIES_PER_KV) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=qmask, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
    for start in range(0, seq_len, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        block = tl.load(block_tables_ptr + b * stride_bt + pos // PAGE, mask=valid, other=0)
        offsets = block * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch
        kvmask = valid[:, None] & (dims[None, :] < HEAD_DIM)
        k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # padding rows (seq_len 0) come out as zeros
    tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=qmask)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr, out_ptr, scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program per (query tile, sequence, head): causal attention of the tile's queries, which are
    the last tokens of the sequence, over its cached keys."""
    tile = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    context = seq_len - q_len
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    rmask = rows < q_len
    qmask = rmask[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + (q_start + rows)[:, None] * stride_qt + h * stride_qh + dims[None, :], mask=qmask, other=0.0)
    kvh = h // QUERIES_PER_KV
    q_pos = context + rows
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634
    end = tl.minimum(seq_len, context + (tile + 1) * BLOCK_M)  # keys past the tile's last query are masked anyway
    for start in range(0, end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < seq_len
        block = tl.load(block_tables_ptr + b * stride_bt + pos // PAGE, mask=valid, other=0)
        offsets = block * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch
        kvmask = valid[:, None] & (dims[None, :] < HEAD_DIM)
        k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + h * stride_oh + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=qmask)


def _dot_precision(query: torch.Tensor) -> str:
    # float32 engines keep full precision; TF32 would cost them about three decimal digits.
    return "ieee" if query.dtype == torch.float32 else "tf32"


def paged_attention_decode(query, kv_cache, block_tables, seq_lens, scale, out=None, block_n: int = 64):
    """One query token per sequence: query ``[B, heads, d]``, seq_lens ``[B]`` (int32 tensor)."""
    num_seqs, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    _decode_kernel[(num_seqs, num_kv_heads)](
        query, k_cache, v_cache, block_tables, seq_lens, out, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), PAGE=k_cache.shape[1], BLOCK_N=block_n,
        DOT_PRECISION=_dot_precision(query),
        num_warps=4, num_stages=2,
    )
    return out


def paged_attention_prefill(query, kv_cache, block_tables, seq_lens, query_start_loc, max_query_len: int, scale, out=None,
                            block_m: int = 64, block_n: int = 64):
    """Packed queries ``[T, heads, d]`` of several sequences (any lengths, cached prefixes allowed)."""
    _, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(query) if out is None else out
    grid = (triton.cdiv(max_query_len, block_m), num_seqs, num_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        PAGE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=_dot_precision(query),
        num_warps=4, num_stages=2,
    )
    return out
