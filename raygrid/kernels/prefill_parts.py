"""What the prompt attention kernels share (``triton_attention._prefill_kernel`` and ``gluon_attention._prefill_kernel``,
which calls these Triton functions from Gluon): how programs are numbered, one per query tile across the batch, so
that the grid (``num_tokens // TOKENS + num_seqs`` tiles) depends on the shapes alone and a CUDA graph can capture a
launch; and the online softmax step."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_tile(query_start_ptr, num_seqs, TOKENS: tl.constexpr):
    """A prompt kernel program's sequence b, its first query, its query tile within b, and b's query count. Query
    tiles are numbered across the batch from the last (the programs with the most keys start first): sequence b
    owns the tiles from query_start[b] // TOKENS + b on. Found by a binary search over query_start."""
    t = tl.num_programs(1) - 1 - tl.program_id(1)
    lo = 0  # the last sequence whose first tile is at or before t: first(lo) <= t < first(hi)
    hi = num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(query_start_ptr + mid) // TOKENS + mid <= t:
            lo = mid
        else:
            hi = mid
    q_start = tl.load(query_start_ptr + lo)
    return lo, q_start, t - (q_start // TOKENS + lo), tl.load(query_start_ptr + lo + 1) - q_start


@triton.jit
def online_softmax(s, m_i, l_i, qk_scale):
    """Scores ``s`` folded into the running max and sum (base 2): the probabilities, the new max and sum, and the factor
    the output so far is rescaled by."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + tl.sum(p, 1), alpha


@triton.jit
def exp2_fma(x):
    """2**x for x <= 0 without the special-function unit, on the FMA and integer units (FlashAttention 4's way of
    taking part of a softmax's exponentials off that unit): x = j + r with j = round(x) and |r| <= 1/2; 2**r from a
    degree-3 polynomial (relative error under 7.5e-5, fitted for relative error on [-1/2, 1/2]); 2**j added to its
    exponent. x below -125 (-inf included) gives 2**-125, where ``tl.exp2`` gives about 0: no difference once a
    probability is summed or rounded to 16 bits beside the row's largest, which is 1."""
    x = tl.maximum(x, -125.0)
    shifted = x + 12582912.0  # 1.5 * 2**23: x rounded to an integer, held in the mantissa's low bits
    r = x - (shifted - 12582912.0)
    p = ((0.05517166 * r + 0.24261113) * r + 0.69326097) * r + 0.99992806
    return (p.to(tl.int32, bitcast=True) + (shifted.to(tl.int32, bitcast=True) << 23)).to(tl.float32, bitcast=True)


@triton.jit
def online_softmax_fma(s, m_i, l_i, qk_scale):
    """``online_softmax`` with the probabilities raised by ``exp2_fma``."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    p = exp2_fma(s * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    return p, m_new, l_i * alpha + tl.sum(p, 1), alpha

