"""What the prompt attention kernels share (``triton_attention._prefill_kernel`` and ``gluon_attention._prefill_kernel``,
which calls these Triton functions from Gluon): how programs are numbered, one per query tile across the batch, so
that the grid (``num_tokens // TOKENS + num_seqs`` tiles) depends on the shapes alone and a CUDA graph can capture a
launch; and the online softmax step."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def program_order(head_groups):
    """A program of the grid (head slots, query tiles): its head slot, and its tile counted from the last. Programs
    start in the order of their linear index (axis 0 fastest). With ``head_groups`` 1 that is tile by tile, every
    head slot of a tile together, the tiles with the most keys first. With more groups (a divisor of the head
    slots), each group of head slots runs all its tiles before the next group starts: the programs running at once
    read the keys and values of fewer heads, which stay in L2 when a long context's would not."""
    slots = tl.num_programs(0)
    tiles = tl.num_programs(1)
    index = tl.program_id(1) * slots + tl.program_id(0)
    width = slots // head_groups  # head slots a group
    group = index // (width * tiles)
    within = index - group * width * tiles
    return group * width + within % width, tiles - 1 - within // width


@triton.jit
def program_tile(query_start_ptr, num_seqs, TOKENS: tl.constexpr, t):
    """A prompt kernel program's sequence b, its first query, its query tile within b, and b's query count. Query
    tiles are numbered across the batch from the last (the programs with the most keys start first): sequence b
    owns the tiles from query_start[b] // TOKENS + b on, and ``t`` is the program's number in that count
    (``program_order``). Found by a binary search over query_start."""
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
