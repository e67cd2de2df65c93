"""Prompt attention on Hopper in Gluon (Triton's lower-level language), for long prompts: the tiles of
``triton_attention._prefill_kernel`` with two halves, with each step's K/V copies asked for as it starts and each
half's softmax overlapping the other half's matrix products.

The Triton kernel keeps two K/V slots. Its pipeliner asks for tile j + 1's copies at the end of step j, after the
block-table load that gives their address. Step j + 1 then starts by waiting for them. On an H200, Nsight Compute
puts 14% of the kernel's warp samples at that wait (benchmarks/README.md, "Prefill attention with its copies asked
for a step ahead"). Here each step first asks for the next tile's copies, into the slot the step before has
finished with. The table entry was read a step earlier still. Then it waits for its own tile, which has had a
whole step to arrive.

A step over a key tile, for the program's two halves: the two query heads of one kv head, over the same 64 tokens.
1. Ask for the next tile's K and V; wait for this tile's K.
2. Ask for both halves' scores (queries times K); wait for the first half's.
3. Fold the first half's scores into its running max and sum (online softmax) while the second half's are
   computed. Rescale its output. Wait for V, and ask for the product of its probabilities with V.
4. Wait for the second half's scores; its softmax runs while the first half's product does. Ask for the second
   half's product.
5. Wait for both products.

No product stays in flight past its step. In Triton's kernel the second half's product with V is still running
when the next step asks for scores. Written that way in Gluon, ptxas waited after every product (notes
C7513/C7515). Waited for within the step, they stay asynchronous (Triton 3.6 and 3.9;
``benchmarks/scripts/wgmma_check.py`` and a CPU test check it). Against Triton's order (each half's scores waited
for before the next is asked), this overlap gave 2 to 4% on an H200 (benchmarks/README.md).

Used for 16-bit prompts with head_dim 128, at least two query heads a kv head, and pages of whole 64-key tiles
(``fits``), when the launch's sequences bring at least ``MIN_QUERIES`` queries each on average. Shorter prompts
take the Triton kernel, which was faster there on an H200.
"""

from __future__ import annotations

import functools

import torch

from raygrid.kernels.prefill_parts import online_softmax, program_tile
from raygrid.kernels.variants import unaligned

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                    warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # A bulk copy into shared memory: ``async_load`` from Triton 3.7, ``async_copy_global_to_shared`` before.
    _bulk_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    # All the program's threads meet: ``barrier`` from Triton 3.7, ``thread_barrier`` before.
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
except ImportError:  # a Triton without Gluon's Hopper operations
    gluon = None

TOKENS = 64  # query tokens a program (for each of its two heads)
BLOCK_N = 64  # keys a step
HEAD_DIM = 128
STAGES = 2  # K/V slots: two programs an SM fit in shared memory (98 KB each)
MIN_QUERIES = 4096  # average queries a sequence from which a launch takes this kernel


def available() -> bool:
    return gluon is not None


if gluon is not None:

    @gluon.jit
    def _tile_row(table_row_ptr, tile, num_tiles, N: gl.constexpr, PAGE: gl.constexpr):
        """The cache row where key tile ``tile`` starts (tiles past the last read the last's: the table ends there)."""
        start = gl.minimum(tile, num_tiles - 1) * N
        return gl.load(table_row_ptr + start // PAGE) * PAGE + start % PAGE

    @gluon.jit
    def _load_tile(k_desc, v_desc, k_smem, v_smem, k_bar, v_bar, row, kv_col, pred):
        """A key and a value tile into one slot, by one bulk copy each."""
        mbarrier.expect(k_bar, k_desc.block_type.nbytes, pred=pred)
        _bulk_load(k_desc, [row, kv_col], k_bar, k_smem, pred=pred)
        mbarrier.expect(v_bar, v_desc.block_type.nbytes, pred=pred)
        _bulk_load(v_desc, [row, kv_col], v_bar, v_smem, pred=pred)

    @gluon.jit
    def _masked(s, start, q_pos, end, unmasked_end, N: gl.constexpr, s_layout: gl.constexpr):
        """On the diagonal, scores of keys after a row's own position, or past the sequence, set to -inf."""
        if start >= unmasked_end:
            k_pos = start + gl.arange(0, N, layout=gl.SliceLayout(0, s_layout))
            keep = (gl.expand_dims(k_pos, 0) <= gl.expand_dims(q_pos, 1)) & gl.expand_dims(k_pos < end, 0)
            s = gl.where(keep, s, float("-inf"))
        return s

    # As triton_attention._prefill_kernel: a step's sequence count or table width of 1 or a multiple of 16, or its
    # tables, lengths and query starts read from a row past the first, would each compile a variant of their own while
    # users wait.
    @gluon.jit(do_not_specialize=["num_seqs", "stride_bt"], **unaligned("block_tables_ptr", "seq_lens_ptr", "query_start_ptr"))
    def _prefill_kernel(
        q_desc, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, query_start_ptr, out_ptr, scale, num_seqs,
        stride_ot, stride_oh, stride_bt,
        QUERIES_PER_KV: gl.constexpr, PAGE: gl.constexpr, STAGES: gl.constexpr,
    ):
        """One program per (pair of query heads of one kv head, tile of ``TOKENS`` query tokens), numbered as
        ``triton_attention._prefill_kernel``'s programs: the same grid, the same padding rules (spare tiles and
        sequences without queries return at once; rows past the last sequence are left as they were)."""
        T: gl.constexpr = q_desc.block_type.shape[0]
        D: gl.constexpr = q_desc.block_type.shape[1]
        N: gl.constexpr = k_desc.block_type.shape[0]
        dtype: gl.constexpr = q_desc.dtype
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        v_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                                  order=[1, 0])

        first_head = gl.program_id(0) * 2
        b, q_start, tile, q_len = program_tile(query_start_ptr, num_seqs, T)
        if (tile < 0) | (tile * T >= q_len):  # before the first sequence's tiles, or past this one's queries
            return
        seq_len = gl.load(seq_lens_ptr + b)
        context = seq_len - q_len
        kv_col = (first_head // QUERIES_PER_KV) * D
        qk_scale = scale * 1.4426950408889634  # exp2 instead of exp
        table_row = block_tables_ptr + b * stride_bt
        unmasked_end = (context + tile * T + 1) // N * N  # keys before it are seen by every row: no masks
        end = gl.minimum(seq_len, context + (tile + 1) * T)
        num_tiles = gl.cdiv(end, N)

        qa_smem = gl.allocate_shared_memory(dtype, [T, D], q_desc.layout)
        qb_smem = gl.allocate_shared_memory(dtype, [T, D], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, N, D], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, N, D], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_bars.index(i), count=1)
            mbarrier.init(v_bars.index(i), count=1)

        q_row = q_start + tile * T
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        _bulk_load(q_desc, [q_row, first_head * D], q_bar, qa_smem)
        _bulk_load(q_desc, [q_row, (first_head + 1) * D], q_bar, qb_smem)
        for i in gl.static_range(STAGES - 1):
            _load_tile(k_desc, v_desc, k_smem.index(i), v_smem.index(i), k_bars.index(i), v_bars.index(i),
                       _tile_row(table_row, i, num_tiles, N, PAGE), kv_col, i < num_tiles)
        row_ahead = _tile_row(table_row, STAGES - 1, num_tiles, N, PAGE)
        mbarrier.wait(q_bar, 0)

        q_pos = context + tile * T + gl.arange(0, T, layout=rows_s)
        ma = gl.full([T], float("-inf"), gl.float32, layout=rows_s)
        la = gl.zeros([T], gl.float32, layout=rows_s)
        mb = gl.full([T], float("-inf"), gl.float32, layout=rows_s)
        lb = gl.zeros([T], gl.float32, layout=rows_s)
        acca = gl.zeros([T, D], gl.float32, layout=o_layout)
        accb = gl.zeros([T, D], gl.float32, layout=o_layout)
        zero = gl.zeros([T, N], gl.float32, layout=s_layout)
        for j in range(num_tiles):
            slot = j % STAGES
            phase = (j // STAGES) & 1
            k_tile = k_smem.index(slot)
            v_tile = v_smem.index(slot)
            # The slot of tile j + STAGES - 1 held tile j - 1, whose products the last step waited for.
            ahead = j + STAGES - 1
            nxt = ahead % STAGES
            _load_tile(k_desc, v_desc, k_smem.index(nxt), v_smem.index(nxt), k_bars.index(nxt), v_bars.index(nxt),
                       row_ahead, kv_col, ahead < num_tiles)
            row_ahead = _tile_row(table_row, ahead + 1, num_tiles, N, PAGE)  # read a step before it is needed
            mbarrier.wait(k_bars.index(slot), phase)
            sa = warpgroup_mma(qa_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
            sb = warpgroup_mma(qb_smem, k_tile.permute((1, 0)), zero, use_acc=False, is_async=True)
            sa = warpgroup_mma_wait(num_outstanding=1, deps=(sa,))  # the second half's scores run on
            start = j * N
            pa, ma, la, alpha_a = online_softmax(_masked(sa, start, q_pos, end, unmasked_end, N, s_layout), ma, la, qk_scale)
            acca = acca * gl.expand_dims(gl.convert_layout(alpha_a, rows_o), 1)
            mbarrier.wait(v_bars.index(slot), phase)
            if start + N > seq_len:  # the last page's slots past the sequence hold anything (NaN too): 0 x NaN is not 0
                v_rows = start + gl.arange(0, N, layout=gl.SliceLayout(1, v_layout))
                v = v_tile.load(v_layout)
                v_tile.store(gl.where(gl.expand_dims(v_rows < seq_len, 1), v, gl.zeros_like(v)))
                fence_async_shared()
                _barrier()
            acca = warpgroup_mma(gl.convert_layout(pa.to(dtype), p_layout), v_tile, acca, is_async=True)
            sb = warpgroup_mma_wait(num_outstanding=1, deps=(sb,))  # the first half's product with V runs on
            pb, mb, lb, alpha_b = online_softmax(_masked(sb, start, q_pos, end, unmasked_end, N, s_layout), mb, lb, qk_scale)
            accb = accb * gl.expand_dims(gl.convert_layout(alpha_b, rows_o), 1)
            accb = warpgroup_mma(gl.convert_layout(pb.to(dtype), p_layout), v_tile, accb, is_async=True)
            acca, accb = warpgroup_mma_wait(num_outstanding=0, deps=(acca, accb))
        mbarrier.invalidate(q_bar)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(k_bars.index(i))
            mbarrier.invalidate(v_bars.index(i))

        tokens = tile * T + gl.arange(0, T, layout=rows_o)
        dims = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
        offsets = gl.expand_dims((q_start + tokens) * stride_ot, 1) + gl.expand_dims(dims, 0)
        store_mask = gl.expand_dims(tokens < q_len, 1) & gl.expand_dims(dims < D, 0)
        la = gl.convert_layout(gl.where(la == 0.0, 1.0, la), rows_o)
        lb = gl.convert_layout(gl.where(lb == 0.0, 1.0, lb), rows_o)
        gl.store(out_ptr + first_head * stride_oh + offsets, (acca / gl.expand_dims(la, 1)).to(dtype), mask=store_mask)
        gl.store(out_ptr + (first_head + 1) * stride_oh + offsets, (accb / gl.expand_dims(lb, 1)).to(dtype),
                 mask=store_mask)


def fits(query: torch.Tensor, k_cache: torch.Tensor, num_seqs: int) -> bool:
    """Whether this kernel takes a launch: Gluon present, a CUDA device of compute capability 9.x, and a launch that
    ``takes`` describes."""
    if gluon is None or query.device.type != "cuda" or _capability(query.device.index or 0)[0] != 9:
        return False
    return takes(query, k_cache, num_seqs)


def takes(query: torch.Tensor, k_cache: torch.Tensor, num_seqs: int) -> bool:
    """The launches the kernel is for: 16-bit queries and cache of one dtype, head_dim 128, a query-head group of an
    even size, whole 64-key tiles in each page, the cache's rows dense and each head's queries one bulk copy (16-byte
    aligned), and at least MIN_QUERIES queries a sequence on average."""
    num_blocks, page, num_kv_heads, head_dim = k_cache.shape
    return (query.shape[0] >= MIN_QUERIES * max(num_seqs, 1)  # first: most launches (short prompts) stop here
            and query.dtype in (torch.bfloat16, torch.float16) and k_cache.dtype == query.dtype and head_dim == HEAD_DIM
            and (query.shape[1] // num_kv_heads) % 2 == 0 and page % BLOCK_N == 0 and query.stride(2) == 1
            and query.stride(1) == head_dim and (query.stride(0) * query.element_size()) % 16 == 0
            and query.data_ptr() % 16 == 0
            and k_cache.stride() == (page * num_kv_heads * head_dim, num_kv_heads * head_dim, head_dim, 1))


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


def _descriptor(tensor2d: torch.Tensor, rows: int) -> "TensorDescriptor":
    """A bulk-copy descriptor of ``rows`` x HEAD_DIM tiles over a 2-D view."""
    layout = gl.NVMMASharedLayout.get_default_for([rows, HEAD_DIM], gl.bfloat16 if tensor2d.dtype == torch.bfloat16 else gl.float16)
    return TensorDescriptor(tensor2d, list(tensor2d.shape), list(tensor2d.stride()), [rows, HEAD_DIM], layout)


def paged_attention_prefill(query, kv_cache, block_tables, seq_lens, query_start_loc, scale, out, **variant):
    """``triton_attention.paged_attention_prefill`` for launches that ``fits`` allows: same arguments, same result.
    ``variant``: constexprs a candidate kernel adds, passed to its launch (benchmarks/scripts/ab_gluon_constexpr.py)."""
    num_tokens, num_heads, head_dim = query.shape
    k_cache, v_cache = kv_cache[0], kv_cache[1]
    num_blocks, page, num_kv_heads, _ = k_cache.shape
    rows = num_blocks * page
    queries = query.as_strided((num_tokens, num_heads * head_dim), (query.stride(0), 1))
    num_seqs = seq_lens.shape[0]
    _prefill_kernel[(num_heads // 2, num_tokens // TOKENS + num_seqs)](
        _descriptor(queries, TOKENS), _descriptor(k_cache.view(rows, num_kv_heads * head_dim), BLOCK_N),
        _descriptor(v_cache.view(rows, num_kv_heads * head_dim), BLOCK_N), block_tables, seq_lens, query_start_loc, out,
        scale, num_seqs, out.stride(0), out.stride(1), block_tables.stride(0),
        QUERIES_PER_KV=num_heads // num_kv_heads, PAGE=page, STAGES=STAGES, num_warps=4, **variant,
    )
    return out
