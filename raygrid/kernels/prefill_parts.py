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
