"""Triton kernels of paged attention: storing K/V by slot mapping, decode, and prefill with a cached
prefix. Their definition is ``paged_attention_ref.py``; tests compare the two on random inputs.

Cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``.
"""

from __future__ import annotations

import functools
import os

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
def _attend_tile(
    q, pos, kv_valid, score_mask, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table_row_ptr, kvh, qk_scale, dims,
    stride_cb, stride_cs, stride_ch, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One step of online softmax: the queries ``q`` against the keys at positions ``pos`` (found through
    the block table), folded into the running max ``m_i``, sum ``l_i`` and output ``acc`` (base 2)."""
    block = tl.load(table_row_ptr + pos // PAGE, mask=kv_valid, other=0)
    offsets = block * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch
    kvmask = kv_valid[:, None] & (dims[None, :] < HEAD_DIM)
    k = tl.load(k_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_cache_ptr + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, out_ptr, partial_out_ptr, partial_lse_ptr, scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """One program per (sequence, kv head, split): the kv head's K/V are read once for all its query heads.
    With SPLITS > 1 each program takes one slice of the context (at least MIN_SPLIT tokens, so short
    sequences use fewer slices) and writes its partial output and log-sum-exp for
    ``_combine_splits_kernel``; that keeps the GPU busy when a few sequences are long."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N, MIN_SPLIT)
    lo = split * per_split
    hi = tl.minimum(seq_len, lo + per_split)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kvh * QUERIES_PER_KV + groups
    qmask = (groups[:, None] < QUERIES_PER_KV) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=qmask, other=0.0)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        m_i, l_i, acc = _attend_tile(
            q, pos, valid, valid[None, :], m_i, l_i, acc, k_cache_ptr, v_cache_ptr, block_tables_ptr + b * stride_bt, kvh,
            qk_scale, dims, stride_cb, stride_cs, stride_ch, HEAD_DIM, PAGE, DOT_PRECISION,
        )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # padding rows (seq_len 0) and empty splits: zeros
    if SPLITS == 1:
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        num_heads = tl.num_programs(1) * QUERIES_PER_KV
        row = (b * num_heads + heads) * SPLITS + split
        lse = m_i + tl.log2(tl.maximum(l_i, 1.0))  # l_i >= 1 unless the split is empty, whose m_i is -inf
        tl.store(partial_out_ptr + row[:, None] * BLOCK_D + dims[None, :], out, mask=qmask)
        tl.store(partial_lse_ptr + row, lse, mask=groups < QUERIES_PER_KV)


@triton.jit
def _combine_splits_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """One program per (sequence, head): the splits' partial outputs weighted by their share of the softmax."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    row = (b * tl.num_programs(1) + h) * SPLITS + splits
    lse = tl.load(partial_lse_ptr + row, mask=splits < SPLITS, other=float("-inf"))
    top = tl.max(lse, 0)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))  # empty splits (lse -inf) weigh 0
    partial = tl.load(partial_out_ptr + row[:, None] * BLOCK_D + dims[None, :], mask=(splits < SPLITS)[:, None], other=0.0)
    total = tl.sum(weight, 0)
    out = tl.sum(weight[:, None] * partial, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + b * stride_ot + h * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dims < HEAD_DIM)


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
        m_i, l_i, acc = _attend_tile(
            q, pos, valid, valid[None, :] & (pos[None, :] <= q_pos[:, None]), m_i, l_i, acc, k_cache_ptr, v_cache_ptr,
            block_tables_ptr + b * stride_bt, kvh, qk_scale, dims, stride_cb, stride_cs, stride_ch, HEAD_DIM, PAGE, DOT_PRECISION,
        )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + rows)[:, None] * stride_ot + h * stride_oh + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=qmask)


def _dot_precision(query: torch.Tensor) -> str:
    # float32 engines keep full precision; TF32 would cost them about three decimal digits.
    return "ieee" if query.dtype == torch.float32 else "tf32"


# Split the context of each sequence when the batch alone has fewer (sequence, kv head) programs than
# the GPU has SMs (RAYGRID_DECODE_MAX_SPLITS=1 turns splitting off). Measured on an H200
# (benchmarks/README.md): splitting larger batches gains nothing, since their programs already fill it.
_MAX_SPLITS = int(os.environ.get("RAYGRID_DECODE_MAX_SPLITS", "16"))
_PROGRAMS_PER_SM = 1


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def decode_splits(num_seqs: int, num_kv_heads: int, device: torch.device) -> int:
    """Context slices per sequence: enough programs for every SM, from the batch size alone (so a CUDA
    graph captured for a batch size stays valid whatever the sequence lengths)."""
    if device.type != "cuda" or num_seqs == 0:
        return 1
    wanted = _PROGRAMS_PER_SM * _num_sms(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(_MAX_SPLITS, triton.cdiv(wanted, num_seqs * num_kv_heads)))


def paged_attention_decode(query, kv_cache, block_tables, seq_lens, scale, out=None, block_n: int = 64, num_splits: int | None = None,
                           min_split_tokens: int = 512, num_warps: int = 4, num_stages: int = 2):
    """One query token per sequence: query ``[B, heads, d]``, seq_lens ``[B]`` (int32 tensor). The context
    is cut into ``num_splits`` slices of at least ``min_split_tokens`` (default: from the batch size)."""
    num_seqs, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    splits = decode_splits(num_seqs, num_kv_heads, query.device) if num_splits is None else num_splits
    block_d = max(16, triton.next_power_of_2(head_dim))
    partial_out = partial_lse = out  # unused placeholders when not splitting
    if splits > 1:
        partial_out = torch.empty(num_seqs, num_heads, splits, block_d, dtype=torch.float32, device=query.device)
        partial_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=query.device)
    _decode_kernel[(num_seqs, num_kv_heads, splits)](
        query, k_cache, v_cache, block_tables, seq_lens, out, partial_out, partial_lse, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, PAGE=k_cache.shape[1], BLOCK_N=block_n, SPLITS=splits, MIN_SPLIT=min_split_tokens,
        DOT_PRECISION=_dot_precision(query),
        num_warps=num_warps, num_stages=num_stages,
    )
    if splits > 1:
        _combine_splits_kernel[(num_seqs, num_heads)](
            partial_out, partial_lse, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
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
