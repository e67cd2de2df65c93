"""Triton kernels of paged attention: storing K/V by slot mapping, decode, and prefill with a cached
prefix. Their definition is ``paged_attention_ref.py``; tests compare the two on random inputs.

Cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_dim]``, in the model's dtype or in
float8 e4m3 (``kv_cache_dtype="fp8"``, unit scales): stored saturated at +-448, read back into the query's dtype,
or into float16 when the queries are bf16 (``_fp16_compute``).
"""

from __future__ import annotations

import functools
import json
import math
import os
from typing import NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

try:  # host-side descriptors of bulk (TMA) copies; older Tritons gather rows instead
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:
    TensorDescriptor = None

from raygrid.kernels import gluon_attention
from raygrid.kernels.prefill_parts import online_softmax, program_tile
from raygrid.kernels.pdl import pdl_launch, pdl_wait
from raygrid.kernels.triton_quant import ROUND_BEFORE_FP8_CAST, round_to_e4m3
from raygrid.kernels.variants import graph_rows, unaligned


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    FP8_CACHE: tl.constexpr, ROUND_FIRST: tl.constexpr, PDL: tl.constexpr,
):
    pdl_wait(PDL)
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
    if FP8_CACHE:
        k = tl.clamp(k.to(tl.float32), -448.0, 448.0)
        v = tl.clamp(v.to(tl.float32), -448.0, 448.0)
        if ROUND_FIRST:
            k, v = round_to_e4m3(k), round_to_e4m3(v)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _tile_width(head_dim: int) -> int:
    """Columns of the kernels' head tiles (``BLOCK_D``): a power of 2, at least 16 (``tl.dot``'s least)."""
    return max(16, triton.next_power_of_2(head_dim))


def store_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value ``[T, kv_heads, head_dim]`` into the cache slots; a slot of -1 is skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=triton.next_power_of_2(num_kv_heads),
        BLOCK_D=_tile_width(head_dim), PAGE=k_cache.shape[1],
        FP8_CACHE=k_cache.dtype == torch.float8_e4m3fn, ROUND_FIRST=ROUND_BEFORE_FP8_CAST, **pdl_launch(key.device),
    )


@triton.jit
def _attend_tile(
    q, start, pos, kv_valid, score_mask, m_i, l_i, acc, k_cache, v_cache, table_row_ptr, kvh, qk_scale, dims,
    stride_cb, stride_cs, stride_ch, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr, WIDE: tl.constexpr,
):
    """One step of online softmax: the queries ``q`` against the keys at positions ``pos`` (``start`` on, found through
    the block table), folded into the running max ``m_i``, sum ``l_i`` and output ``acc`` (base 2). With TMA the
    tile starts at a multiple of its length and lies in one page; ``k_cache``/``v_cache`` are tensor descriptors
    over the cache's [slots, kv_heads * head_dim] rows, and each tile comes by one bulk copy. With WIDE the rows'
    offsets are 64-bit (``wide_offsets``)."""
    if TMA:
        row = tl.load(table_row_ptr + start // PAGE) * PAGE + start % PAGE
        k = k_cache.load([row, kvh * HEAD_DIM]).to(q.dtype)
    else:
        block = tl.load(table_row_ptr + pos // PAGE, mask=kv_valid, other=0)
        if WIDE:
            block = block.to(tl.int64)
        offsets = block * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch
        kvmask = kv_valid[:, None] & (dims[None, :] < HEAD_DIM)
        k = tl.load(k_cache + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0).to(q.dtype)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(score_mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if TMA:  # the page's slots past the context hold anything; p is 0 there, and 0 x NaN is not
        v = tl.where(kv_valid[:, None], v_cache.load([row, kvh * HEAD_DIM]).to(q.dtype), 0.0)
    else:
        v = tl.load(v_cache + offsets[:, None] + dims[None, :], mask=kvmask, other=0.0).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def attend_range(q, lo, hi, k_cache, v_cache, table_row_ptr, kvh, scale, dims, stride_cb, stride_cs, stride_ch,
                 BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                 PAGE: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, WIDE: tl.constexpr,
                 LOOP_STAGES: tl.constexpr = None):
    """The queries ``q`` ``[BLOCK_G, BLOCK_D]`` of one kv head over its keys at positions ``lo .. hi``, ``BLOCK_N`` a
    step (``_attend_tile``): the running max, sum and unnormalized output (base 2) at the end. ``LOOP_STAGES``: the
    loop's software-pipeline stages (None: the launch's ``num_stages``). The block table's load counts as a level of
    its own, so with Triton 3.6 to 3.9 the loop holds two tiles in flight from 5 stages up, one below."""
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
    for start in tl.range(lo, hi, BLOCK_N, num_stages=LOOP_STAGES):
        pos = start + tl.arange(0, BLOCK_N)
        valid = pos < hi
        m_i, l_i, acc = _attend_tile(q, start, pos, valid, valid[None, :], m_i, l_i, acc, k_cache, v_cache, table_row_ptr,
                                     kvh, qk_scale, dims, stride_cb, stride_cs, stride_ch, HEAD_DIM, PAGE, DOT_PRECISION,
                                     TMA, WIDE)
    return m_i, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, order_ptr, out_ptr, partial_out_ptr, partial_lse_ptr,
    scale, stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLITS: tl.constexpr, MIN_SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr, TMA: tl.constexpr, WIDE: tl.constexpr, ORDERED: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (sequence, kv head, split): the kv head's K/V are read once for all its query heads.
    With SPLITS > 1 each program takes one slice of the context (at least MIN_SPLIT tokens, so short
    sequences use fewer slices) and writes its partial output and log-sum-exp for
    ``_combine_splits_kernel``; that keeps the GPU busy when a few sequences are long. A context that fits in one
    slice is written whole by its first program (no partial output, nothing for the combine kernel).

    Programs start in grid order, (kv heads, sequences, splits): a sequence's kv heads start together. With ORDERED
    the sequences start in the order ``order_ptr`` lists them: the engine's, longest first, so that the longest
    contexts do not start last and leave a tail of few programs (benchmarks/README.md, "Decode programs started
    longest first")."""
    pdl_wait(PDL)
    kvh = tl.program_id(0)
    rank = tl.program_id(1)
    num_kv_heads = tl.num_programs(0)
    if ORDERED:
        b = tl.load(order_ptr + rank)
    else:
        b = rank
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    per_split, slices = _slices(seq_len, SPLITS, BLOCK_N, MIN_SPLIT)
    if SPLITS > 1 and split > 0 and slices <= 1:
        return
    lo = split * per_split
    hi = tl.minimum(seq_len, lo + per_split)
    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kvh * QUERIES_PER_KV + groups
    qmask = (groups[:, None] < QUERIES_PER_KV) & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=qmask, other=0.0)
    if FP16_COMPUTE:  # keys and values follow q's dtype
        q = q.to(tl.float16)
    m_i, l_i, acc = attend_range(q, lo, hi, k_cache_ptr, v_cache_ptr, block_tables_ptr + b * stride_bt, kvh, scale, dims,
                                 stride_cb, stride_cs, stride_ch, BLOCK_G, BLOCK_D, BLOCK_N, HEAD_DIM, PAGE, DOT_PRECISION, TMA,
                                 WIDE)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # padding rows (seq_len 0) and empty splits: zeros
    if SPLITS == 1 or slices <= 1:
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=qmask)
    else:
        num_heads = num_kv_heads * QUERIES_PER_KV
        row = (b * num_heads + heads) * SPLITS + split
        lse = m_i + tl.log2(tl.maximum(l_i, 1.0))  # l_i >= 1 unless the split is empty, whose m_i is -inf
        tl.store(partial_out_ptr + row[:, None] * BLOCK_D + dims[None, :], out, mask=qmask)
        tl.store(partial_lse_ptr + row, lse, mask=groups < QUERIES_PER_KV)


@triton.jit
def _slices(seq_len, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr, MIN_SPLIT: tl.constexpr):
    """A context's slice length (a multiple of BLOCK_N, at least MIN_SPLIT) and how many slices hold its keys."""
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N, MIN_SPLIT)
    return per_split, tl.cdiv(seq_len, per_split)


@triton.jit
def _combine_splits_kernel(
    partial_out_ptr, partial_lse_ptr, out_ptr, seq_lens_ptr, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
    MIN_SPLIT: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (sequence, head): the splits' partial outputs weighted by their share of the softmax. A
    context in one slice was written whole by the decode kernel."""
    pdl_wait(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    if _slices(tl.load(seq_lens_ptr + b), SPLITS, BLOCK_N, MIN_SPLIT)[1] <= 1:
        return
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
def _load_tile(ptr, offsets, valid, dims, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr):
    """Rows ``offsets`` of a cache (keys or values) as a [rows, BLOCK_D] tile; masked only where it must be."""
    if MASKED or HEAD_DIM != BLOCK_D:
        return tl.load(ptr + offsets[:, None] + dims[None, :], mask=valid[:, None] & (dims[None, :] < HEAD_DIM), other=0.0)
    return tl.load(ptr + offsets[:, None] + dims[None, :])


@triton.jit
def _prefill_keys(k_cache, table_row_ptr, start, pos, valid, kvh, dims, stride_cb, stride_cs, stride_ch, dtype: tl.constexpr,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, CAUSAL_MASK: tl.constexpr,
                  TMA: tl.constexpr, WIDE: tl.constexpr):
    """The key tile at positions ``pos`` (``start`` on), in ``dtype``, and where it lies, for ``_prefill_values``:
    with TMA its first row in the cache (one bulk copy), otherwise each row's offset (rows gathered through the
    block table)."""
    if TMA:
        row = tl.load(table_row_ptr + start // PAGE) * PAGE + start % PAGE
        return k_cache.load([row, kvh * HEAD_DIM]).to(dtype), row
    else:
        if CAUSAL_MASK:
            block = tl.load(table_row_ptr + pos // PAGE, mask=valid, other=0)
        else:
            block = tl.load(table_row_ptr + pos // PAGE)
        if WIDE:
            block = block.to(tl.int64)
        offsets = block * stride_cb + (pos % PAGE) * stride_cs + kvh * stride_ch
        return _load_tile(k_cache, offsets, valid, dims, HEAD_DIM, BLOCK_D, CAUSAL_MASK).to(dtype), offsets


@triton.jit
def _prefill_values(v_cache, where, valid, kvh, dims, dtype: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    CAUSAL_MASK: tl.constexpr, TMA: tl.constexpr):
    """The value tile that ``_prefill_keys`` found ``where``."""
    if TMA:
        v = v_cache.load([where, kvh * HEAD_DIM]).to(dtype)
        if CAUSAL_MASK:  # slots past the sequence's end hold anything; p is 0 there, and 0 x NaN is not
            v = tl.where(valid[:, None], v, 0.0)
        return v
    else:
        return _load_tile(v_cache, where, valid, dims, HEAD_DIM, BLOCK_D, CAUSAL_MASK).to(dtype)


@triton.jit
def _prefill_tile(
    q, q_pos, start, end, m_i, l_i, acc, k_cache, v_cache, table_row_ptr, kvh, qk_scale, dims,
    stride_cb, stride_cs, stride_ch, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    WIDE: tl.constexpr,
):
    """Online softmax over the keys at [start, start + BLOCK_N): only the tiles on the diagonal
    (CAUSAL_MASK) pay for masks; the ones below it are read and used whole. With TMA the tile lies in one
    page and ``k_cache``/``v_cache`` are tensor descriptors over the cache's [slots, kv_heads * head_dim] rows:
    the copy engine brings the tile in one bulk copy."""
    pos = start + tl.arange(0, BLOCK_N)
    valid = pos < end
    k, where = _prefill_keys(k_cache, table_row_ptr, start, pos, valid, kvh, dims, stride_cb, stride_cs, stride_ch,
                             q.dtype, HEAD_DIM, BLOCK_D, PAGE, CAUSAL_MASK, TMA, WIDE)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if CAUSAL_MASK:
        s = tl.where(valid[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    p, m_i, l_i, alpha = online_softmax(s, m_i, l_i, qk_scale)
    v = _prefill_values(v_cache, where, valid, kvh, dims, q.dtype, HEAD_DIM, BLOCK_D, CAUSAL_MASK, TMA)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return m_i, l_i, acc


@triton.jit
def _prefill_tile_halves(
    qa, qb, pos_a, pos_b, start, end, ma, la, acca, mb, lb, accb, k_cache, v_cache, table_row_ptr, kvh, qk_scale, dims,
    stride_cb, stride_cs, stride_ch, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL_MASK: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    WIDE: tl.constexpr,
):
    """``_prefill_tile`` for a query tile held as two halves (``SUBTILES=2``), each with its own running max, sum and
    output. Triton waits for each half's scores right after asking for them (its pipeliner waits for every product
    in flight once a result is read within the step). What overlaps is the first half's product with V, which runs
    while the second half's softmax does. On an H200 this took the kernel from 477 to 528 TFLOP/s at 32k tokens
    (benchmarks/README.md; ``benchmarks/scripts/wgmma_check.py --schedule`` prints the order of products and waits)."""
    pos = start + tl.arange(0, BLOCK_N)
    valid = pos < end
    k, where = _prefill_keys(k_cache, table_row_ptr, start, pos, valid, kvh, dims, stride_cb, stride_cs, stride_ch,
                             qa.dtype, HEAD_DIM, BLOCK_D, PAGE, CAUSAL_MASK, TMA, WIDE)
    sa = tl.dot(qa, tl.trans(k), input_precision=DOT_PRECISION)
    sb = tl.dot(qb, tl.trans(k), input_precision=DOT_PRECISION)
    if CAUSAL_MASK:
        sa = tl.where(valid[None, :] & (pos[None, :] <= pos_a[:, None]), sa, float("-inf"))
        sb = tl.where(valid[None, :] & (pos[None, :] <= pos_b[:, None]), sb, float("-inf"))
    pa, ma, la, alpha_a = online_softmax(sa, ma, la, qk_scale)
    v = _prefill_values(v_cache, where, valid, kvh, dims, qa.dtype, HEAD_DIM, BLOCK_D, CAUSAL_MASK, TMA)
    acca = tl.dot(pa.to(v.dtype), v, acca * alpha_a[:, None], input_precision=DOT_PRECISION)
    pb, mb, lb, alpha_b = online_softmax(sb, mb, lb, qk_scale)
    accb = tl.dot(pb.to(v.dtype), v, accb * alpha_b[:, None], input_precision=DOT_PRECISION)
    return ma, la, acca, mb, lb, accb


# num_seqs and the block table's width vary from step to step. Left to Triton, a value of 1 or a multiple of 16
# would each compile a variant of their own in the middle of serving (about 2 s on an H200), for no gain here. So
# would the sequences' tables, lengths and query starts where a step's leading decode rows go to the decode kernel
# (``paged_attention_split``): this kernel reads them from row d on, 16-byte aligned only where d is a multiple of 4.
# Their loads are scalars (kernels/variants.py).
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"], **unaligned("block_tables_ptr", "seq_lens_ptr", "query_start_ptr"))
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, query_start_ptr, out_ptr, scale, num_seqs,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    QUERIES_PER_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PACK: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FP16_COMPUTE: tl.constexpr, TMA: tl.constexpr, WIDE: tl.constexpr, SUBTILES: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (pack of query heads, query tile): causal attention of the tile's queries, which are
    the last tokens of their sequence, over its cached keys. The tile's BLOCK_M rows are BLOCK_M / PACK
    tokens of PACK query heads that share a kv head (row r: head r % PACK, token r // PACK), so each key and
    value tile read serves them all.

    Query tiles are numbered across the batch: sequence b owns the tiles from query_start[b] // TOKENS + b
    on, at least as many as its queries fill, so the grid is num_tokens // TOKENS + num_seqs whatever the
    lengths. A graph captured for a token count and a number of sequences therefore fits every step within
    them: padding sequences (no queries) and spare tiles return at once. A program finds its sequence by a
    binary search over query_start. Tiles are numbered from the last, so the programs with the most keys
    (the last tiles of the sequences at the end) start first."""
    pdl_wait(PDL)
    TOKENS: tl.constexpr = BLOCK_M // PACK
    first_head = tl.program_id(0) * PACK
    b, q_start, tile, q_len = program_tile(query_start_ptr, num_seqs, TOKENS)
    if (tile < 0) | (tile * TOKENS >= q_len):  # before the first sequence's tiles (query_start[0] > 0), or past b's
        return
    seq_len = tl.load(seq_lens_ptr + b)
    context = seq_len - q_len
    dims = tl.arange(0, BLOCK_D)
    kvh = first_head // QUERIES_PER_KV
    qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
    table_row = block_tables_ptr + b * stride_bt
    # Keys before the tile's first query are seen by every row: whole tiles, no masks. The rest, up to
    # the tile's last query, is the diagonal.
    unmasked_end = (context + tile * TOKENS + 1) // BLOCK_N * BLOCK_N
    end = tl.minimum(seq_len, context + (tile + 1) * TOKENS)
    if SUBTILES == 1:
        rows = tl.arange(0, BLOCK_M)
        q, tokens, heads, qmask = _prefill_queries(q_ptr, q_start, q_len, tile, first_head, rows, dims, stride_qt, stride_qh,
                                                   HEAD_DIM, TOKENS, PACK, FP16_COMPUTE)
        q_pos = context + tokens
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for start in range(0, unmasked_end, BLOCK_N):
            m_i, l_i, acc = _prefill_tile(
                q, q_pos, start, end, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table_row, kvh, qk_scale, dims,
                stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, False, DOT_PRECISION, TMA, WIDE,
            )
        for start in range(unmasked_end, end, BLOCK_N):
            m_i, l_i, acc = _prefill_tile(
                q, q_pos, start, end, m_i, l_i, acc, k_cache_ptr, v_cache_ptr, table_row, kvh, qk_scale, dims,
                stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, True, DOT_PRECISION, TMA, WIDE,
            )
        _prefill_store(out_ptr, q_start, tokens, heads, dims, qmask, acc, l_i, stride_ot, stride_oh)
    else:
        HALF: tl.constexpr = BLOCK_M // 2
        rows_a = tl.arange(0, HALF)
        rows_b = HALF + tl.arange(0, HALF)
        qa, tokens_a, heads_a, qmask_a = _prefill_queries(q_ptr, q_start, q_len, tile, first_head, rows_a, dims, stride_qt,
                                                          stride_qh, HEAD_DIM, TOKENS, PACK, FP16_COMPUTE)
        qb, tokens_b, heads_b, qmask_b = _prefill_queries(q_ptr, q_start, q_len, tile, first_head, rows_b, dims, stride_qt,
                                                          stride_qh, HEAD_DIM, TOKENS, PACK, FP16_COMPUTE)
        pos_a = context + tokens_a
        pos_b = context + tokens_b
        ma = tl.full([HALF], float("-inf"), dtype=tl.float32)
        la = tl.zeros([HALF], dtype=tl.float32)
        acca = tl.zeros([HALF, BLOCK_D], dtype=tl.float32)
        mb = tl.full([HALF], float("-inf"), dtype=tl.float32)
        lb = tl.zeros([HALF], dtype=tl.float32)
        accb = tl.zeros([HALF, BLOCK_D], dtype=tl.float32)
        for start in range(0, unmasked_end, BLOCK_N):
            ma, la, acca, mb, lb, accb = _prefill_tile_halves(
                qa, qb, pos_a, pos_b, start, end, ma, la, acca, mb, lb, accb, k_cache_ptr, v_cache_ptr, table_row, kvh,
                qk_scale, dims, stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, False, DOT_PRECISION, TMA,
                WIDE,
            )
        for start in range(unmasked_end, end, BLOCK_N):
            ma, la, acca, mb, lb, accb = _prefill_tile_halves(
                qa, qb, pos_a, pos_b, start, end, ma, la, acca, mb, lb, accb, k_cache_ptr, v_cache_ptr, table_row, kvh,
                qk_scale, dims, stride_cb, stride_cs, stride_ch, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, True, DOT_PRECISION, TMA,
                WIDE,
            )
        _prefill_store(out_ptr, q_start, tokens_a, heads_a, dims, qmask_a, acca, la, stride_ot, stride_oh)
        _prefill_store(out_ptr, q_start, tokens_b, heads_b, dims, qmask_b, accb, lb, stride_ot, stride_oh)


@triton.jit
def _prefill_queries(q_ptr, q_start, q_len, tile, first_head, rows, dims, stride_qt, stride_qh, HEAD_DIM: tl.constexpr,
                     TOKENS: tl.constexpr, PACK: tl.constexpr, FP16_COMPUTE: tl.constexpr):
    """The queries of a tile's ``rows`` (row r: token r // PACK of the tile, head first_head + r % PACK), with
    their tokens, heads and mask."""
    tokens = tile * TOKENS + rows // PACK
    heads = first_head + rows % PACK
    qmask = (tokens < q_len)[:, None] & (dims[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + (q_start + tokens)[:, None] * stride_qt + heads[:, None] * stride_qh + dims[None, :], mask=qmask, other=0.0)
    if FP16_COMPUTE:
        q = q.to(tl.float16)
    return q, tokens, heads, qmask


@triton.jit
def _prefill_store(out_ptr, q_start, tokens, heads, dims, qmask, acc, l_i, stride_ot, stride_oh):
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (q_start + tokens)[:, None] * stride_ot + heads[:, None] * stride_oh + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=qmask)


def _fp16_compute(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """bf16 queries over a float8 cache compute in float16: float8 e4m3 converts to float16 exactly and in one
    instruction a pair on Hopper, where to bf16 it takes several, enough to bound the decode kernel by its ALU
    (benchmarks/README.md). float16 keeps three more mantissa bits than bf16; queries stay far below its range."""
    return k_cache.dtype == torch.float8_e4m3fn and query.dtype == torch.bfloat16


def _dot_precision(query: torch.Tensor) -> str:
    # float32 engines keep full precision; TF32 would cost them about three decimal digits.
    return "ieee" if query.dtype == torch.float32 else "tf32"


def overridden(defaults: dict, variable: str) -> dict:
    """``defaults`` with the environment variable's JSON object over them (``with_overrides``)."""
    return with_overrides(defaults, json.loads(os.environ.get(variable, "{}")), variable)


def with_overrides(defaults: dict, overrides: dict, source: str) -> dict:
    """``defaults`` with ``overrides`` over them; a key they lack is refused, by name, as ``source``'s (an override that
    names no setting would otherwise leave a benchmark running the defaults unawares)."""
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown}; the keys are {sorted(defaults)}")
    return {**defaults, **overrides}


# Split the context of each sequence when the batch alone has fewer (sequence, kv head) programs than the
# GPU has SMs, into enough slices for a few programs per SM: one program each cannot keep enough reads in
# flight to approach the memory bandwidth. Measured on an H200 (benchmarks/README.md): splitting larger
# batches gains nothing, since their programs already fill it. RAYGRID_DECODE_SPLIT_POLICY (JSON) overrides
# it, for benchmarks; '{"max_splits": 1}' turns splitting off.
DECODE_SPLIT_POLICY = overridden(dict(programs_per_sm=3, max_splits=64, min_split_tokens=256), "RAYGRID_DECODE_SPLIT_POLICY")


@functools.cache
def _sms_of_index(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _num_sms(device: torch.device) -> int:
    """The SMs of a CUDA device (an index-less device is the current one)."""
    return _sms_of_index(device.index if device.index is not None else torch.cuda.current_device())


def decode_splits(num_seqs: int, num_kv_heads: int, device: torch.device, programs_per_sm: int | None = None,
                  max_splits: int | None = None) -> int:
    """Context slices per sequence, from the batch size alone (so a CUDA graph captured for a batch size
    stays valid whatever the sequence lengths)."""
    if device.type != "cuda" or num_seqs == 0:
        return 1
    return splits_on(_num_sms(device), num_seqs, num_kv_heads, programs_per_sm, max_splits)


def splits_on(sms: int, num_seqs: int, num_kv_heads: int, programs_per_sm: int | None = None,
              max_splits: int | None = None) -> int:
    """``decode_splits`` on a GPU of ``sms`` SMs, for the batch's ``graph_rows``."""
    rows = graph_rows(num_seqs)
    if rows * num_kv_heads >= sms:
        return 1
    wanted = (programs_per_sm or DECODE_SPLIT_POLICY["programs_per_sm"]) * sms
    return max(1, min(max_splits or DECODE_SPLIT_POLICY["max_splits"], triton.cdiv(wanted, rows * num_kv_heads)))


# The decode kernel's launch: block_n keys a step, fp8_block_n over an FP8 cache (the same 16 KiB tile of keys).
# Measured on an H200 (benchmarks/README.md): 128 keys over the FP8 cache gave W1 on the 8B shape +4.7%; over
# bf16, 64 and 128 are within noise. RAYGRID_DECODE_CONFIG (JSON, e.g. '{"block_n": 128}') overrides it, for
# benchmarks of other launches (benchmarks/scripts/sweep_decode_kv_dtype.py times several). tma: tiles by bulk copy
# where pages hold them whole, only in launches that split contexts (few long sequences). In one device command on an
# H200, bulk copies took batch-1 TPOT at 32k from 2.036 to 2.001 ms, but W1's decode steps of 64 to 256 sequences
# ran 3% slower with them: over contexts of unequal lengths, as W1's, bulk copies lose by 4 to 5% at 192 and 256
# sequences, though they win over equal ones (sweep_decode_attention.py --order).
# fp8_narrow_from: from this many programs an SM (kv heads x sequences, unsplit), launches over an FP8 cache step 32 keys
# with one warp (0: never). With the longest contexts started first, that launch took W1 on the 8B shape with FP8
# weights and cache from 13,372 to 13,727 output tok/s; at 128 sequences (8 programs an SM) it lost to 128 keys with 4
# warps in the sweep, at 192 and 256 it won by 18 to 26%.
# fp8_medium_from: from this many programs an SM up to fp8_narrow_from, 64 keys with two warps (0: never). In the same
# sweep, at 128 sequences (7.75 programs an SM) that launch took 106.8 us against 117.1 with 128 keys and 4 warps; at
# 64 (3.9 an SM) it lost, 84.9 against 62.9.
DECODE_CONFIG = overridden(dict(block_n=64, fp8_block_n=128, num_warps=4, num_stages=2, tma="split", fp8_narrow_from=10,
                                 fp8_medium_from=6), "RAYGRID_DECODE_CONFIG")


def fp8_launch_on(sms: int | None, num_seqs: int, num_kv_heads: int, splits: int) -> tuple[int, int]:
    """Keys a step and warps of a decode launch over an FP8 cache on a GPU of ``sms`` SMs (None: no GPU): the more
    programs an SM (unsplit, the batch's ``graph_rows``), the narrower."""
    if splits == 1 and sms:
        per_sm = graph_rows(num_seqs) * num_kv_heads / sms
        for tier, launch in (("fp8_narrow_from", (32, 1)), ("fp8_medium_from", (64, 2))):
            if 0 < DECODE_CONFIG[tier] <= per_sm:
                return launch
    return DECODE_CONFIG["fp8_block_n"], DECODE_CONFIG["num_warps"]


# The prefill kernel's launch: BLOCK_M query rows against BLOCK_N keys a step, K/V tiles by bulk copy where a page
# holds whole tiles (a GPU engine's 64-token pages: 11 to 14% faster than gathering rows). Chosen by
# benchmarks/scripts/sweep_prefill_attention.py on an H200 (benchmarks/README.md). RAYGRID_PREFILL_CONFIG
# (JSON, e.g. '{"pack": 2}') overrides it, for benchmarks of other launches. subtiles=2 holds each 128-row tile as
# two halves whose softmax and products interleave: 528 against 477 TFLOP/s at 32k tokens on an H200. gluon=True hands
# long prompts (gluon_attention.fits) to the Gluon kernel with the same tiles, whose copies are asked for a step
# earlier and whose halves' softmax overlaps the other half's products: 553 against 520 at 32k tokens, 584 against
# 524 at 8k (one sweep, 0745c36).
PREFILL_CONFIG = overridden(dict(block_m=128, block_n=64, num_warps=4, num_stages=3, pack=2, tma=True, subtiles=2,
                                  gluon=True),
                             "RAYGRID_PREFILL_CONFIG")
# A batch whose sequences bring few queries each (a mixed step: many decode rows beside a prompt or two) would
# leave most of a 128-row tile empty, and its tiles are compute spent on nothing: it takes 16-row tiles. On an
# H200, 256 decode rows of 640-token contexts beside two 512-token prompts: 192 us a layer against 289 us with
# the prompt tiles, and 184 us for the decode kernel on the decode rows alone (sweep_mixed_attention.py,
# benchmarks/README.md).
PREFILL_SHORT_CONFIG = dict(block_m=16, block_n=64, num_warps=4, num_stages=2, pack=2)
SHORT_QUERIES = 64  # below this many queries per sequence on average, the short tiles


# How a step with prompt tokens whose sequences the host knows picks its launches (``prompt_launch_for``): "cost"
# compares the keys each launch's query tiles would read, "shape" is ``prefill_launch``'s rule by shapes alone.
# ``long_tile_cost``: a 128-row tile's time a key over a 16-row tile's, where most of the tile's rows are empty (a
# decode row's): 289 against 192 us a layer for 256 decode rows of 640-token contexts beside two 512-token prompts on
# an H200 (the tiles' key reads there: 166,400 and 180,736). On an H100, W1 with "cost" against "shape" (two runs each
# on one engine): 20,525.0 and 20,520.3 against 20,481.2 and 20,429.5 output tok/s, its steps with prompt tokens 405.3
# against 439.2 ms of GPU time (twenty-ninth session, benchmarks/README.md).
# ``split_decode_rows``: a step whose first sequences are at least this many decode rows (one query each) gives them
# to the decode kernel and the rest to the prefill kernel (``paged_attention_split``; 0: never). Over W1-like steps on
# an H100 (700-token contexts beside 14 prompts of 560 tokens, sweep_mixed_attention.py) the split took 206.5 us a
# layer with 129 decode rows and 319.0 with 250, against 245.4 and 393.1 for the best one launch; with 16 it lost,
# 107.2 against 97.2 (the long tiles carry a few decode rows in the prompts' shadow). Swept on an H100 (thirty-sixth
# session): 32 rows lost 4.8%; 64, 80 and 96 -0.7, +4.7 and -2.5% (a wash); 112 to 192 won 14 to 16%. The H200: not yet.
# RAYGRID_PREFILL_TILE_CHOICE (JSON) overrides these, for A/B runs.
PREFILL_TILE_CHOICE = overridden(dict(rule="cost", long_tile_cost=1.64, split_decode_rows=64),
                                 "RAYGRID_PREFILL_TILE_CHOICE")


def check_tile_choice(choice: dict, source: str = "RAYGRID_PREFILL_TILE_CHOICE") -> None:
    """Refuse a ``PREFILL_TILE_CHOICE`` whose values mean nothing (a misspelt rule would otherwise pass as "cost"),
    naming ``source`` and the field."""
    if choice["rule"] not in ("cost", "shape"):
        raise ValueError(f"{source}: rule must be \"cost\" or \"shape\", got {choice['rule']!r}")
    if not isinstance(choice["long_tile_cost"], (int, float)) or choice["long_tile_cost"] <= 0:
        raise ValueError(f"{source}: long_tile_cost must be a number above 0, got {choice['long_tile_cost']!r}")
    if not isinstance(choice["split_decode_rows"], int) or choice["split_decode_rows"] < 0:
        raise ValueError(f"{source}: split_decode_rows must be an integer of 0 (never split) or more, "
                         f"got {choice['split_decode_rows']!r}")


check_tile_choice(PREFILL_TILE_CHOICE)


class PromptLaunch(NamedTuple):
    """How a step with prompt tokens launches attention (``prompt_launch_for``): its first ``decode_rows`` sequences
    (one query each) by the decode kernel, the rest by the prefill kernel with ``tiles``."""

    decode_rows: int
    tiles: dict


def prefill_launch(num_tokens: int, num_seqs: int) -> dict:
    """The prefill kernel's launch for a batch of ``num_tokens`` queries over ``num_seqs`` sequences, by these shapes
    alone (what a CUDA graph captures)."""
    return PREFILL_SHORT_CONFIG if num_tokens < SHORT_QUERIES * num_seqs else PREFILL_CONFIG


def tile_key_reads(query_lens: np.ndarray, seq_lens: np.ndarray, queries_per_tile: int) -> int:
    """Keys the prefill kernel's query tiles read over a batch: a sequence of ``q`` queries whose context ends at
    ``s`` takes ceil(q / Q) tiles of Q queries, and its t-th tile reads the keys up to its last query (causal)."""
    q, s = np.asarray(query_lens, dtype=np.int64), np.asarray(seq_lens, dtype=np.int64)
    tiles = -(-q // queries_per_tile)
    reads = tiles * (s - q) + queries_per_tile * tiles * (tiles + 1) // 2 - (tiles * queries_per_tile - q)
    return int(reads.sum())


def prefill_launch_for(query_start_loc: list[int], seq_lens: list[int]) -> dict:
    """The prefill kernel's launch for a batch the host knows (``PREFILL_TILE_CHOICE``): the tiles whose key reads,
    weighed by their time a key, are fewer. Short tiles suit decode rows, whose 128-row tiles hold one query
    each; long ones suit prompts, whose keys 16-row tiles read eight times as often. By shapes alone a step of
    8,192 tokens took short tiles from 129 sequences on, when W1's steps with prompts carry about 14 prompts of 560
    tokens beside their decode rows, and its GPU time jumped there (21.1 to 25.7 ms on an H100, benchmarks/README.md)."""
    return _tiles_for(np.diff(np.asarray(query_start_loc, dtype=np.int64)), seq_lens)


def _tiles_for(query_lens: np.ndarray, seq_lens: list[int]) -> dict:
    if PREFILL_TILE_CHOICE["rule"] == "shape":
        return prefill_launch(int(query_lens.sum()), len(seq_lens))
    short = tile_key_reads(query_lens, seq_lens, PREFILL_SHORT_CONFIG["block_m"] // PREFILL_SHORT_CONFIG["pack"])
    long = tile_key_reads(query_lens, seq_lens, PREFILL_CONFIG["block_m"] // PREFILL_CONFIG["pack"])
    return PREFILL_SHORT_CONFIG if short < PREFILL_TILE_CHOICE["long_tile_cost"] * long else PREFILL_CONFIG


def prompt_launch_for(query_start_loc: list[int], seq_lens: list[int]) -> PromptLaunch:
    """The launches of a step with prompt tokens whose lengths the host knows (``PREFILL_TILE_CHOICE``): its leading
    decode rows to the decode kernel where there are at least ``split_decode_rows`` of them, and the tiles
    (``prefill_launch_for``) of the sequences left. Decode rows after the first prompt stay with the prefill kernel:
    the batch adds requests at its end, so a step's new prompts follow the running requests' rows."""
    query_lens = np.diff(np.asarray(query_start_loc, dtype=np.int64))
    not_decode = np.flatnonzero(query_lens != 1)
    decode_rows = int(not_decode[0]) if len(not_decode) else len(query_lens)
    least = PREFILL_TILE_CHOICE["split_decode_rows"]
    if not least or decode_rows < least or decode_rows == len(query_lens):
        decode_rows = 0
    return PromptLaunch(decode_rows, _tiles_for(query_lens[decode_rows:], seq_lens[decode_rows:]))


def paged_attention_split(query, kv_cache, block_tables, seq_lens, query_start_loc, scale, decode_rows: int,
                          out=None, launch: dict | None = None, order: torch.Tensor | None = None):
    """``paged_attention_prefill`` of a batch whose first ``decode_rows`` sequences bring one query each (rows
    ``0 .. decode_rows``), in two launches: those rows by the decode kernel (started in ``order``, as
    ``paged_attention_decode``), the other sequences by the prefill kernel with ``launch``'s tiles."""
    out = torch.empty_like(query) if out is None else out
    d = decode_rows
    paged_attention_decode(query[:d], kv_cache, block_tables[:d], seq_lens[:d], scale, out=out[:d], order=order)
    return paged_attention_prefill(query, kv_cache, block_tables[d:], seq_lens[d:], query_start_loc[d:], scale, out=out,
                                   launch=launch)


def paged_attention_decode(query, kv_cache, block_tables, seq_lens, scale, out=None, block_n: int | None = None,
                           num_splits: int | None = None, min_split_tokens: int = DECODE_SPLIT_POLICY["min_split_tokens"],
                           num_warps: int | None = None, num_stages: int = DECODE_CONFIG["num_stages"],
                           tma: bool | None = None, order: torch.Tensor | None = None):
    """One query token per sequence: query ``[B, heads, d]``, seq_lens ``[B]`` (int32 tensor). The context
    is cut into ``num_splits`` slices of at least ``min_split_tokens`` (default: from the batch size). With ``tma``,
    where pages hold whole tiles of ``block_n`` keys, each tile comes by one bulk copy; otherwise rows are gathered
    through the block table. Left None, ``DECODE_CONFIG["tma"]`` decides: for 16-bit queries, in split launches.
    ``order`` (a permutation of the rows, ``[B]``; None: the batch's) is the order in which the sequences' programs
    start."""
    num_seqs, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query) if out is None else out
    splits = decode_splits(num_seqs, num_kv_heads, query.device) if num_splits is None else num_splits
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    launch_n, launch_warps = (fp8_launch_on(_num_sms(query.device) if query.device.type == "cuda" else None, num_seqs,
                                            num_kv_heads, splits) if fp8
                              else (DECODE_CONFIG["block_n"], DECODE_CONFIG["num_warps"]))
    block_n = launch_n if block_n is None else block_n
    num_warps = launch_warps if num_warps is None else num_warps
    block_d = _tile_width(head_dim)
    partial_out = partial_lse = out  # unused placeholders when not splitting
    if splits > 1:
        partial_out = torch.empty(num_seqs, num_heads, splits, block_d, dtype=torch.float32, device=query.device)
        partial_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=query.device)
    if tma is None:  # DECODE_CONFIG's "tma": True, False, or "split" (where the contexts are split)
        policy = DECODE_CONFIG["tma"]
        tma = query.element_size() == 2 and (policy is True or (policy == "split" and splits > 1))
    # Slices start at multiples of block_n when min_split_tokens is a multiple of it; otherwise a tile could straddle
    # two pages.
    tma = tma and (splits == 1 or min_split_tokens % block_n == 0)
    keys, values = _cache_descriptors(k_cache, v_cache, block_n) if tma else (k_cache, v_cache)
    _decode_kernel[(num_kv_heads, num_seqs, splits)](
        query, keys, values, block_tables, seq_lens, seq_lens if order is None else order, out, partial_out, partial_lse, scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_D=block_d, PAGE=k_cache.shape[1], BLOCK_N=block_n, SPLITS=splits, MIN_SPLIT=min_split_tokens,
        DOT_PRECISION=_dot_precision(query), FP16_COMPUTE=_fp16_compute(query, k_cache), TMA=keys is not k_cache,
        WIDE=keys is k_cache and wide_offsets(k_cache), ORDERED=order is not None, num_warps=num_warps, num_stages=num_stages,
        **pdl_launch(query.device),
    )
    if splits > 1:
        _combine_splits_kernel[(num_seqs, num_heads)](
            partial_out, partial_lse, out, seq_lens, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), BLOCK_N=block_n,
            MIN_SPLIT=min_split_tokens, **pdl_launch(query.device),
        )
    return out


def paged_attention_prefill(query, kv_cache, block_tables, seq_lens, query_start_loc, scale, out=None,
                            block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                            num_stages: int | None = None, pack: int | None = None, tma: bool | None = None,
                            subtiles: int | None = None, gluon: bool | None = None, launch: dict | None = None):
    """Packed queries ``[T, heads, d]`` of several sequences (any lengths, cached prefixes allowed). ``pack``
    query heads of one kv head share a program (at most the group size, and a divisor of it). With ``tma``, where
    pages hold whole tiles of ``block_n`` keys, each tile comes by one bulk copy (the default for 16-bit queries;
    otherwise rows are gathered through the block table). ``subtiles=2`` holds each query tile as two halves
    (``_prefill_tile_halves``; tiles of 32 rows or more). ``gluon``: the default launch of a long prompt goes to
    ``gluon_attention``'s kernel where ``gluon_attention.fits`` says so. A launch parameter left None comes from
    ``launch`` (``PREFILL_CONFIG`` or ``PREFILL_SHORT_CONFIG``), or where that is None from ``prefill_launch`` for this
    batch's shapes.

    The launch depends on the shapes alone (and ``launch``), so a CUDA graph may capture it: rows past ``query_start_loc[-1]``
    belong to no sequence (their output is left as it was), and sequences with no queries are skipped."""
    num_tokens, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_kv_heads = k_cache.shape[2]
    num_seqs = seq_lens.shape[0]
    launch = launch or prefill_launch(num_tokens, num_seqs)
    block_m = launch["block_m"] if block_m is None else block_m
    block_n = launch["block_n"] if block_n is None else block_n
    num_warps = launch["num_warps"] if num_warps is None else num_warps
    num_stages = launch["num_stages"] if num_stages is None else num_stages
    pack = launch["pack"] if pack is None else pack
    if subtiles is None:  # the launch's, where a tile of block_m rows has halves of at least 16 (tl.dot's least)
        subtiles = launch.get("subtiles", 1) if block_m >= 32 else 1
    if subtiles not in (1, 2) or block_m // subtiles < 16:
        raise ValueError(f"subtiles: 1, or 2 where block_m // 2 >= 16 (got {subtiles} with block_m {block_m})")
    if tma is None:  # float32 tiles of the default shape would not fit shared memory's pipeline stages
        tma = launch.get("tma", False) and query.element_size() == 2
    group = num_heads // num_kv_heads
    pack = math.gcd(pack, group)
    out = torch.empty_like(query) if out is None else out
    gluon = launch.get("gluon", False) if gluon is None else gluon
    gluon_tiles = (2 * gluon_attention.TOKENS, gluon_attention.BLOCK_N, 2, 2)  # its (block_m, block_n, pack, subtiles)
    if gluon and tma and (block_m, block_n, pack, subtiles) == gluon_tiles and gluon_attention.fits(query, k_cache, num_seqs):
        return gluon_attention.paged_attention_prefill(query, kv_cache, block_tables, seq_lens, query_start_loc, scale, out)
    grid = (num_heads // pack, num_tokens // (block_m // pack) + num_seqs)
    keys, values = _cache_descriptors(k_cache, v_cache, block_n) if tma else (k_cache, v_cache)
    _prefill_kernel[grid](
        query, keys, values, block_tables, seq_lens, query_start_loc, out, scale, num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        QUERIES_PER_KV=group, HEAD_DIM=head_dim, BLOCK_D=_tile_width(head_dim),
        PAGE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_N=block_n, PACK=pack, DOT_PRECISION=_dot_precision(query),
        FP16_COMPUTE=_fp16_compute(query, k_cache), TMA=keys is not k_cache,
        WIDE=keys is k_cache and wide_offsets(k_cache), SUBTILES=subtiles, num_warps=num_warps, num_stages=num_stages,
        **pdl_launch(query.device),
    )
    return out


def wide_offsets(k_cache: torch.Tensor) -> bool:
    """Whether offsets into this cache half need 64 bits: a model of few layers on a large GPU gets more than 2**31
    elements a layer. Launches gathering rows then widen each page's offset (bulk copies address rows, and need no
    such variant: the engine compiles theirs on its small profiling cache). Elsewhere 32 bits are cheaper: 2 to 3% of
    a decode launch at W1's batches on an H200 (benchmarks/README.md)."""
    return k_cache.shape[0] * k_cache.stride(0) > 2**31 - 1


def _tma_fits(k_cache: torch.Tensor, block_n: int) -> bool:
    """Key tiles can come by bulk copy when each lies in one page, a head fills the kernels' tile width exactly and the
    cache's rows are dense in memory."""
    num_blocks, page, num_kv_heads, head_dim = k_cache.shape
    return (TensorDescriptor is not None and page % block_n == 0 and head_dim == _tile_width(head_dim)
            and k_cache.stride() == (page * num_kv_heads * head_dim, num_kv_heads * head_dim, head_dim, 1))


def _cache_descriptors(k_cache: torch.Tensor, v_cache: torch.Tensor, block_n: int):
    """Tensor descriptors of bulk copies of ``block_n`` keys (and values) of one kv head, over the cache's
    [slots, kv_heads * head_dim] rows; the caches themselves where the tiles cannot come that way (``_tma_fits``).
    The shapes are given, not read back by ``from_tensor``: 3 us a descriptor on the host, not 7."""
    if not _tma_fits(k_cache, block_n):
        return k_cache, v_cache
    num_blocks, page, num_kv_heads, head_dim = k_cache.shape
    rows, width = num_blocks * page, num_kv_heads * head_dim
    return tuple(TensorDescriptor(cache.view(rows, width), [rows, width], [width, 1], [block_n, head_dim])
                 for cache in (k_cache, v_cache))
