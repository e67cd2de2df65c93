"""A whole decode pass of a dense Llama or Qwen3 model over one to a few sequences in one persistent launch.

At batch 1 a decode pass is a chain of about ten short kernels a layer, and each kernel boundary costs about 3.3 us
even with PDL and the weights in L2: on Qwen3-0.6B that is most of the step at short contexts, and a third of it at
32k (benchmarks/README.md, "A batch-1 layer as one persistent kernel"). Here the programs (two an SM, or one) stay
resident for the whole pass, and the stages of each layer hand over through arrival counters in global memory (about
1 us) instead of kernel boundaries: a grid-wide barrier after stages 3 to 5, whose next stage needs every unit's
output, and after stages 1 and 2 a counter a kv head (``head_waits``): an attention unit waits only for its kv head's
rows of qkv_proj, and an o_proj unit only for the attention units of the kv heads in its slice of the heads.

1. the residual add and RMSNorm, then qkv_proj (units of ``BN`` output rows);
2. attention: Qwen3's q/k norms and the rotary embedding of this token's query and key, its key and value stored into
   the cache, and the cached context in ``SPLITS`` slices a kv head (each writes its partial output and log-sum-exp);
3. the slices combined, and o_proj (units of ``BN`` rows over a slice of the heads);
4. the residual add and RMSNorm, then gate_up_proj with SiLU-and-mul (units of ``GU_ROWS`` rows of each);
5. down_proj (units of ``D_ROWS`` rows over a slice of ``KS_D`` of K).

Weights are the one input a stage does not wait for: a program reads its first tile of each product into registers
between the barrier's arrival and its wait (``PRELOAD_*``; every product's by default), so the tile is on its way
while the last programs arrive. At Qwen3-0.6B's shape the first tiles of qkv_proj, o_proj and down_proj are the
whole weight, so the barrier after down_proj, during which the next layer's qkv_proj (8.4 MB) is read, is the layer's
longest: on an H100 2.8 us from the last arrival, the weight's time at the copy rate; reading the tiles' addresses a
stage earlier changed nothing (benchmarks/README.md, forty-first session).

With several rows (``rows``, up to ``MAX_ROWS``; the engine takes 1 to ``PERSISTENT_CONFIG["max_rows"]``) each
weight tile a program reads is multiplied with every row in turn, so the weights are read once a pass however many
rows it carries, and stage 2's units are (row, kv head, slice).

The split products of stages 3 and 5 are added in a fixed order by every program, so the pass gives the same bits
every time (atomics would not). Each program keeps its own copy of the residual streams; all copies are equal.
Roundings follow the engine's kernels: the residual stream, the norms, qkv, q and k after rotary, attention's
output, o_proj, gate and up, the activation and down_proj are each rounded to the model's dtype where the layer-by-
layer pass rounds them, so the two agree to that dtype's rounding (tests compare them).

The barriers need every program resident at once: the grid is at most what the GPU holds at once (checked against
the compiled kernel's registers and shared memory), and the launch has no programmatic dependents (PDL), so nothing
else holds an SM while it runs. A barrier that waits too long sets the
error flag rather than hang the GPU (``PersistentDecode.check``). Under Triton's interpreter the programs run one
after another, so the grid there is one program, which does every unit; the barriers and the heads' counters then
pass at once (a wait that does not is an error there after a few polls, and a head's count past its target is one
everywhere).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.triton_attention import attend_range, overridden, wide_offsets
from raygrid.kernels.variants import unaligned

# The longest context (this token included) the engine takes this pass for: Qwen3's longest. On an H200 the pass
# beat the layer-by-layer one at 8k and 16k in every command (1.15 to 1.24x); from 32k to 41k it led in most (1.03
# to 1.10x) and trailed once (0.96x at 32,832). End to end a token at 32k took 1.91 to 1.93 ms against 2.07.
# (The layer-by-layer pass's split decode launch was once said to read the cache faster, 4.4 against 3.4 TB/s, but
# that figure was a subtraction of two passes; measured alone at 32k it read at 3.46, about the pass's stage's rate:
# benchmarks/README.md, thirty-seventh session.) For a few rows the bound is on their contexts together: the keys the
# attention stage reads.
MAX_CONTEXT = 40960
# The most rows (sequences, one token each) one launch takes: each program holds every row's residual stream and
# normed input in registers (two of ``rows * hidden / 128`` floats a thread at 4 warps), and every weight tile it reads
# is multiplied with each row in turn.
MAX_ROWS = 8
# Polls of one barrier before the error flag is set: a few seconds on a GPU; under the interpreter, where one program
# does every unit and a barrier that is not passed at once never will be, a few.
MAX_SPINS, MAX_SPINS_INTERPRETED = 1 << 22, 4
# The layer's tensors, in this order in each row of the pointer table.
W_QKV, W_O, W_GATE_UP, W_DOWN, N_INPUT, N_POST, N_Q, N_K, KV_CACHE, TABLE_WIDTH = map(tl.constexpr, range(10))
# The weight tiles a program reads ahead, each product's first, between a barrier's arrival and its wait (flags).
# Read into registers, a tile stays live across the wait: qkv's and o_proj's (64 and 32 registers at Qwen3-0.6B's
# width) fit beside the rest of the kernel (76 bytes of spills, built for sm_90); gate's, up's and down_proj's (64,
# 64 and 128) spill more. On an H100 the default (qkv and o_proj) took a pass at 32k from 2,067 to 2,038 us and at 512
# from 827 to 785; every tile (down_proj's 128 registers) 3,575 and 2,142; adding gate's, or gate's and down_proj's
# over slices of 1,024, gained nothing at 32k (benchmarks/README.md, nineteenth session).
PRELOAD_QKV, PRELOAD_O, PRELOAD_GATE, PRELOAD_DOWN, PRELOAD_UP = 1, 2, 4, 8, 16
# The launch's defaults, which the engine takes, with the environment's RAYGRID_PERSISTENT_CONFIG (JSON) over them for
# end-to-end benchmarks of other launches: keys a step, the attention loop's stages (0: the launch's), gate_up_proj's
# rows a unit (0: qkv_proj's), down_proj's rows a unit (0: gate_up_proj's) and width of its slices of K (0: as few
# even slices as fit a tile), slices of the context a kv head (0: as many as fill the programs).
# 32-key tiles at 5 stages keep two tiles in flight in the shared memory one 64-key tile took at 2 (38,144 bytes
# against 38,912, built for sm_90); with 8-row gate_up/down units, on an H100, a pass at 512 tokens took 739.8
# against 764.5 us, at 8,192 1,065.9 against 1,091.3 and at 32,832 1,976.0 against 1,984.7 (twenty-fourth session).
# 4-row units then took it to 726.6 and 730.3 against 741.8 and 744.0 us at 512, 1,031.3 and 1,032.6 against 1,056.7
# and 1,059.5 at 8,192, 1,950.8 and 1,951.8 against 1,967.7 and 1,969.6 at 32,832 (down_proj's 256 units of 4 rows
# over K whole, one a program: 5.8 against 6.2 us a layer). Units that fill the programs evenly with wider tiles
# lost: 12-row gate_up units, 256 in tiles of 16 rows, 8.9 against 8.5 us a layer (benchmarks/README.md, twenty-fifth
# session).
# With 4-row units down_proj's tile is 64 registers, so it is read ahead too (``preload``: qkv_proj, o_proj and
# down_proj, 11): a pass 709.7 against 730.0 us at 512, 1,008.7 against 1,028.2 at 8,192, 1,941.8 against 1,962.0 at
# 32,832 (down_proj 4.5 against 5.8 us a layer). Gate's and up's too (31) took gate_up from 8.6 to 7.6 us a layer and
# o_proj, at whose barrier they are asked for, from 3.1 to 3.7: inside the spread; asking for them once the barrier is
# passed (read_after_wait, since removed) took qkv_proj from 3.7 to 6.8 us a layer where it named qkv_proj's tile, and
# lost or tied where it named gate's and up's, or gate's alone (benchmarks/README.md, twenty-sixth session). Each
# attention unit's query halves joined in registers rather than through global memory (``q_in_registers``) and the first
# tile of its slice of the cache asked into L2 before it makes the query ready (``kv_ahead``, GPU only; 0 on CPU): a
# pass 699.1 and 701.4 against 700.6, 704.4 and 706.1 us at 512, 989.9 and 990.1 against 1,008.4 to 1,013.0 at 8,192,
# 1,910.0 and 1,910.2 against 1,923.1 to 1,924.3 at 32,832 (twenty-sixth session; either alone gained little).
# ``max_rows``: the engine takes this pass for decode steps of up to this many requests (a launch each count, captured
# at start), whose contexts together are at most MAX_CONTEXT; larger batches pass layer by layer. On an H100 (us a
# pass, against the layer-by-layer pass in CUDA graphs; each row's context 512 / 4,096 / 16,384): 2 rows 1,057.7 /
# 1,341.7 / 2,263.9 against 1,211.7 / 1,400.6 / 2,284.1; 3 rows 1,266.0 / 1,757.7 / 3,198.8 against 1,213.5 / 1,546.3 /
# 2,890.3; 4 rows 2,178.3 / 2,814.1 / 4,686.2 against 1,213.1 / 1,709.1 / 3,501.8 (thirtieth session). Each row
# multiplies every weight tile again on the CUDA cores, and the rows' streams spill (296 bytes at 2 rows, 748 at 4).
# ``mlp_ahead``: gate_up_proj is the one product whose programs take several units each (768 of 4 rows over 264
# programs at Qwen3-0.6B's width), and each unit's tiles came only after the last unit's sum. Asking for the next
# unit's tiles first, with gate's and up's first tiles read ahead of the barrier's wait too (preload 31), took
# gate_up from 9.2 to 7.2 us a layer (o_proj, at whose barrier those are asked for, 2.95 to 3.6) and the pass, on an
# H100, from 694 to 655 us at 512 tokens, 984 to 947 at 8,192, 1,900 to 1,861 at 32,768, with the same bits (two
# machine starts); a token at 32k 2.086 to 2.044 ms end to end. Two units ahead lost (1,915 us at 32k: 68 bytes of
# spills against 56); the next unit's tiles alone gave 1,877 (benchmarks/README.md, thirty-seventh session).
# ``head_waits``: each qkv_proj unit adds its rows to its kv heads' counters and each attention unit waits for its own
# kv head's, and each attention unit counts at its kv head and each o_proj unit waits for its slice's kv heads, so two
# of a layer's five grid barriers go (a unit no longer waits for the slowest program of the stage before). On an H100,
# each twice, interleaved: a pass 638.7 and 639.5 against 656.5 and 656.7 us at 512 tokens, 932.9 and 928.7 against
# 957.5 and 959.5 at 8,192, 1,842.8 and 1,843.3 against 1,899.8 and 1,891.9 at 32,768 (-2.7 to -2.9%), the same bits
# as the grid barriers; a token at 32k end to end 2.022 and 2.023 against 2.068 and 2.086 ms (246 registers and no
# spills against 255 and 56 bytes; benchmarks/README.md, fortieth session).
PERSISTENT_CONFIG = overridden(dict(block_n=32, attention_stages=5, mlp_rows_per_unit=4, down_rows_per_unit=0,
                                    down_slice=0, splits=0,
                                    preload=PRELOAD_QKV | PRELOAD_O | PRELOAD_GATE | PRELOAD_UP | PRELOAD_DOWN,
                                    kv_ahead=1, q_in_registers=True, mlp_ahead=True, head_waits=True, max_rows=2),
                               "RAYGRID_PERSISTENT_CONFIG")


@triton.jit
def _arrive(counter_ptr, times_ptr, barrier, pid, G, TIMED: tl.constexpr, GRID: tl.constexpr = True):
    """A grid barrier's first half: every program's stores so far made visible to every other (the block's threads
    meet, one thread releases its arrival). Loads issued after it are not ordered by it: weights, which no stage
    writes, are read here for the stage after the barrier (``PRELOAD``). With ``TIMED`` 2 each program records when
    its threads met, before its arrival (``_record_time``). Without ``GRID`` (a stage whose units announce themselves
    to their heads' counters instead, ``HEAD_WAITS``) only the time is recorded."""
    tl.debug_barrier()
    if TIMED == 2:
        tl.store(times_ptr + (barrier * G + pid) * 2, _global_ns())
    if GRID:
        tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def _wait(counter_ptr, err_ptr, target, max_spins, EXACT: tl.constexpr = False):
    """A grid barrier's second half: all ``target`` arrivals (counted from the launch's start) waited for, polling
    with acquiring loads. Data written before a barrier is read after it from L2 (``.cg``). ``EXACT``: a head's
    counter (``HEAD_WAITS``), which no arrival passes before every program has passed this wait, so a count past the
    target is an error (a unit counted twice) and sets the flag, as a wait past ``max_spins`` polls does."""
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < max_spins):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if spins >= max_spins:
        tl.store(err_ptr, 1)
    if EXACT:
        if seen > target:
            tl.store(err_ptr, 1)
    tl.debug_barrier()


@triton.jit
def _global_ns():
    """The GPU's global timer, in ns."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _record_time(times_ptr, index, pid, G, TIMED: tl.constexpr):
    """Barrier ``index`` passed (0: the launch's start). ``TIMED`` 1: program 0 stores the global timer (ns) at
    ``times_ptr[index]``; 2: every program stores it at ``times_ptr[(index * G + pid) * 2 + 1]``, beside the time its
    threads met before its arrival (``_arrive``), for the barriers' timeline."""
    if TIMED == 1:
        if pid == 0:
            tl.store(times_ptr + index, _global_ns())
    if TIMED == 2:
        tl.store(times_ptr + (index * G + pid) * 2 + 1, _global_ns())
        if index == 0:  # the slot beside the start holds the program's SM
            sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
            tl.store(times_ptr + pid * 2, sm.to(tl.int64))


@triton.jit
def _grid_passes(sync, HEAD_WAITS: tl.constexpr):
    """How many grid barriers a program has passed once it passes the one at the end of stage ``sync`` (five a layer,
    counted from 1): every stage's, or with ``HEAD_WAITS`` the last three of each layer's (o_proj's, gate_up_proj's,
    down_proj's; qkv_proj's and attention's units announce themselves to their heads instead)."""
    if HEAD_WAITS:
        sync = 3 * ((sync - 1) // 5) + (sync - 1) % 5 - 1
    return sync


@triton.jit
def _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED: tl.constexpr,
               HEAD_WAITS: tl.constexpr, GRID: tl.constexpr = True):
    """The barrier after a stage (its ``sync + 1``-th of the launch), timed with ``TIMED``; returns its number.
    Without ``GRID`` (a stage whose units announce themselves to their heads instead) nothing is waited for."""
    sync += 1
    _arrive(counter_ptr, times_ptr, sync, pid, G, TIMED, GRID)
    if GRID:
        _wait(counter_ptr, err_ptr, _grid_passes(sync, HEAD_WAITS) * G, max_spins)
    _record_time(times_ptr, sync, pid, G, TIMED)
    return sync


@triton.jit
def _stage_waited(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED: tl.constexpr,
                  HEAD_WAITS: tl.constexpr, GRID: tl.constexpr = True):
    """The rest of ``_stage_end``, for a program that made its arrival (``_arrive``) and asked for the next stage's
    weight tile since."""
    sync += 1
    if GRID:
        _wait(counter_ptr, err_ptr, _grid_passes(sync, HEAD_WAITS) * G, max_spins)
    _record_time(times_ptr, sync, pid, G, TIMED)
    return sync


@triton.jit
def _qkv_rows_done(heads_ptr, row0, row1, NH: tl.constexpr, NKV: tl.constexpr, GROUP: tl.constexpr,
                   D: tl.constexpr):
    """qkv_proj's output rows ``row0 .. row1`` stored (``HEAD_WAITS``): each kv head's counter advanced by how many of
    them are its own, a query head's rows counting at its kv head. Each layer brings every kv head ``(GROUP + 2) * D``
    rows: its query heads', its key's and its value's. The caller's threads met after their stores."""
    _region_rows_done(heads_ptr, row0, row1, 0, GROUP * D, NKV)  # the queries, GROUP * D rows a kv head
    _region_rows_done(heads_ptr, row0, row1, NH * D, D, NKV)  # the keys
    _region_rows_done(heads_ptr, row0, row1, (NH + NKV) * D, D, NKV)  # the values


@triton.jit
def _region_rows_done(heads_ptr, row0, row1, FIRST: tl.constexpr, PER: tl.constexpr, NKV: tl.constexpr):
    """``_qkv_rows_done`` for the region of qkv_proj's rows from ``FIRST``, ``PER`` rows a kv head."""
    lo = tl.maximum(row0, FIRST)
    hi = tl.minimum(row1, FIRST + NKV * PER)
    if lo < hi:
        for g in range((lo - FIRST) // PER, (hi - 1 - FIRST) // PER + 1):
            rows = tl.minimum(hi, FIRST + (g + 1) * PER) - tl.maximum(lo, FIRST + g * PER)
            tl.atomic_add(heads_ptr + g, rows, sem="release", scope="gpu")


@triton.jit
def _layer_tensor(table_ptr, layer, which: tl.constexpr, dtype: tl.constexpr):
    """A layer's tensor from the pointer table (every tensor starts 16-byte aligned)."""
    return tl.multiple_of(tl.load(table_ptr + layer * TABLE_WIDTH + which).to(tl.pointer_type(dtype)), 16)


@triton.jit
def _rms_norm(h, w_ptr, eps, H: tl.constexpr, dtype: tl.constexpr):
    """RMSNorm of each row of the residual stream ``h`` (``[BR, H]``, float32 holding ``dtype`` values), rounded as
    the engine's kernel does."""
    w = tl.load(w_ptr + tl.arange(0, H)).to(tl.float32)
    y = (h * tl.rsqrt(tl.sum(h * h, 1) / H + eps)[:, None]).to(dtype).to(tl.float32)
    return (w[None, :] * y).to(dtype).to(tl.float32)


@triton.jit
def _ordered_sum(h, p_ptr, SPLITS: tl.constexpr, ROWS: tl.constexpr, BR: tl.constexpr, H: tl.constexpr,
                 dtype: tl.constexpr):
    """The residual stream after a split product: the slices' partial sums (``[SPLITS, ROWS, H]``) added in order,
    the product rounded as its own kernel would write it, then added to ``h`` (``[BR, H]``) and rounded."""
    r = tl.arange(0, BR)
    offs = r[:, None] * H + tl.arange(0, H)[None, :]
    mask = (r < ROWS)[:, None]
    total = tl.load(p_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLITS):
        total += tl.load(p_ptr + s * ROWS * H + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return (h + total.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _row(x, b, BR: tl.constexpr):
    """Row ``b`` of ``x`` (``[BR, H]``) as a vector ``[H]``, exactly (the other rows' zeros added to it)."""
    return tl.sum(tl.where(tl.arange(0, BR)[:, None] == b, x, 0.0), 0)


@triton.jit
def _tile(w_ptr, row0, rows_total, stride, col0, cols_total, BN: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr,
          COLS: tl.constexpr):
    """``w[row0:row0+ROWS, col0:col0+COLS]`` in a ``[BN, K]`` tile (``ROWS <= BN``, ``COLS <= K``, powers of 2 the
    tile's sides only); the tile's rows and columns past those, or past the totals, read as zeros. Bounds within the
    tile are compile-time, so a unit of any width keeps the column loads vectorized."""
    r = tl.arange(0, BN)
    c = tl.arange(0, K)
    rows = row0 + r
    cols = col0 + c
    mask = (rows[:, None] < rows_total) & (cols[None, :] < cols_total)
    if ROWS < BN:
        mask = mask & (r < ROWS)[:, None]
    if COLS < K:
        mask = mask & (c < COLS)[None, :]
    return tl.load(w_ptr + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _read_ahead(w_ptr, row0, rows_total, stride, col0, cols_total, BN: tl.constexpr, K: tl.constexpr,
                ROWS: tl.constexpr, COLS: tl.constexpr, READ_AHEAD: tl.constexpr):
    """The tile (``_tile``) a program reads ahead for its first unit of the next stage, between a barrier's arrival
    and its wait, where ``READ_AHEAD`` (a ``PRELOAD_*`` flag); otherwise 0."""
    if READ_AHEAD:
        w = _tile(w_ptr, row0, rows_total, stride, col0, cols_total, BN, K, ROWS, COLS)
    else:
        w = 0
    return w


@triton.jit
def _unit_tile(ahead, u, pid, w_ptr, row0, rows_total, stride, col0, cols_total, BN: tl.constexpr, K: tl.constexpr,
               ROWS: tl.constexpr, COLS: tl.constexpr, READ_AHEAD: tl.constexpr):
    """Unit ``u``'s weight tile (``_tile``): with ``READ_AHEAD``, ``ahead`` for the program's first unit (``pid``),
    read before the barrier's wait; otherwise, and for later units, read now."""
    if READ_AHEAD:
        w = ahead
        if u != pid:
            w = _tile(w_ptr, row0, rows_total, stride, col0, cols_total, BN, K, ROWS, COLS)
    else:
        w = _tile(w_ptr, row0, rows_total, stride, col0, cols_total, BN, K, ROWS, COLS)
    return w


@triton.jit
def _tile_times(w, row0, x, BN: tl.constexpr):
    """A weight tile (``_tile``) times ``x`` in float32, and the tile's output rows."""
    return tl.sum(w.to(tl.float32) * x[None, :], axis=1), row0 + tl.arange(0, BN)


@triton.jit
def _head_halves(qkv_ptr, first, count, norm_ptr, cos, sin, eps, BLOCK: tl.constexpr, HALF: tl.constexpr,
                 QK_NORM: tl.constexpr, dtype: tl.constexpr):
    """Heads ``first .. first+count`` of the qkv output ``[BLOCK, 2 * HALF]`` as their two halves (float32 holding
    ``dtype`` values), after Qwen3's per-head RMSNorm (``QK_NORM``) and the NeoX rotation (``cos``/``sin`` of the
    token's position, ``[HALF]``)."""
    heads = tl.arange(0, BLOCK)
    dims = tl.arange(0, HALF)
    mask = (heads < count)[:, None]
    base = qkv_ptr + (first + heads)[:, None] * (2 * HALF) + dims[None, :]
    x1 = tl.load(base, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    x2 = tl.load(base + HALF, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    if QK_NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(norm_ptr + dims).to(tl.float32)[None, :]
        w2 = tl.load(norm_ptr + HALF + dims).to(tl.float32)[None, :]
        x1 = (w1 * (x1 * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        x2 = (w2 * (x2 * inv_rms).to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
    y1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype).to(tl.float32)
    y2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype).to(tl.float32)
    return y1, y2


@triton.jit
def _kv_into_l2(cache_ptr, v_offset, table_row_ptr, kvh, lo, hi, KEYS: tl.constexpr, NKV: tl.constexpr,
                D: tl.constexpr, PAGE: tl.constexpr, WIDE: tl.constexpr):
    """Keys ``lo .. lo+KEYS`` (up to ``hi``) of kv head ``kvh``, and their values, asked into L2 without waiting for
    them (``prefetch.global.L2``, a request each 64 elements of a row; inline PTX, so GPU only)."""
    LINES: tl.constexpr = (D + 63) // 64
    if lo < hi:
        pos = tl.minimum(lo + tl.arange(0, KEYS), hi - 1)
        block = tl.load(table_row_ptr + pos // PAGE)
        if WIDE:
            block = block.to(tl.int64)
        rows = cache_ptr + block * (PAGE * NKV * D) + (pos % PAGE) * (NKV * D) + kvh * D
        lines = tl.minimum(tl.arange(0, LINES) * 64, D - 1)
        for where in tl.static_range(2):
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                      [rows[:, None] + where * v_offset + lines[None, :]], dtype=tl.int32,
                                      is_pure=False, pack=1)


@triton.jit
def _slice_keys(seq_len, split, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys ``lo .. hi`` of slice ``split`` of a context of ``seq_len``: even slices of whole tiles (the last ones
    may be empty)."""
    per_split = tl.maximum(tl.cdiv(tl.cdiv(seq_len, SPLITS), BLOCK_N) * BLOCK_N, BLOCK_N)
    lo = split * per_split
    return lo, tl.minimum(seq_len, lo + per_split)


@triton.jit
def _attend_slice(qkv_ptr, q_ptr, cache_ptr, v_offset, table_row_ptr, kvh, split, lo, hi, position, slot, cos_ptr, sin_ptr,
                  qn_ptr, kn_ptr, part_ptr, lse_ptr, scale, eps, NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr,
                  GROUP: tl.constexpr, BLOCK_G: tl.constexpr, SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                  PAGE: tl.constexpr, QK_NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDE: tl.constexpr,
                  ATTENTION_STAGES: tl.constexpr, Q_REGS: tl.constexpr, dtype: tl.constexpr):
    """One (kv head, slice) unit of stage 2: the kv head's query heads against the slice's keys ``lo .. hi``
    (``_slice_keys``), which include this
    token's in the last slice (that unit stores its key and value into the cache first). Writes the partial output
    and its log-sum-exp (base 2) for each query head (``-inf`` for an empty slice). The rotated queries go through
    ``q_ptr`` (``[NH, D]``; the units of one kv head write the same values) to come back as one tile, or with
    ``Q_REGS`` are joined into one in registers."""
    D: tl.constexpr = 2 * HALF
    dims = tl.arange(0, HALF)
    full = tl.arange(0, D)
    groups = tl.arange(0, BLOCK_G)
    cos = tl.load(cos_ptr + position * D + dims)
    sin = tl.load(sin_ptr + position * D + dims)
    q1, q2 = _head_halves(qkv_ptr, kvh * GROUP, GROUP, qn_ptr, cos, sin, eps, BLOCK_G, HALF, QK_NORM, dtype)
    gmask = (groups < GROUP)[:, None]
    if Q_REGS:
        q = tl.reshape(tl.permute(tl.join(q1.to(dtype), q2.to(dtype)), (0, 2, 1)), (BLOCK_G, D))
    else:
        rows = q_ptr + (kvh * GROUP + groups)[:, None] * D + dims[None, :]
        tl.store(rows, q1.to(dtype), mask=gmask)
        tl.store(rows + HALF, q2.to(dtype), mask=gmask)
    if (lo <= position) & (position < hi):  # this token's key and value, into the cache before they are read
        k1, k2 = _head_halves(qkv_ptr, NH + kvh, 1, kn_ptr, cos, sin, eps, 1, HALF, QK_NORM, dtype)
        where = cache_ptr + (slot // PAGE) * (PAGE * NKV * D) + (slot % PAGE) * (NKV * D) + kvh * D
        tl.store(where + dims, tl.reshape(k1, (HALF,)).to(dtype))
        tl.store(where + HALF + dims, tl.reshape(k2, (HALF,)).to(dtype))
        tl.store(where + v_offset + full, tl.load(qkv_ptr + (NH + NKV + kvh) * D + full, cache_modifier=".cg"))
    tl.debug_barrier()
    if not Q_REGS:
        q = tl.load(q_ptr + (kvh * GROUP + groups)[:, None] * D + full[None, :], mask=gmask, other=0.0)
    m_i, l_i, acc = attend_range(q, lo, hi, cache_ptr, cache_ptr + v_offset, table_row_ptr, kvh, scale, full,
                                 PAGE * NKV * D, NKV * D, D, BLOCK_G, D, BLOCK_N, D, PAGE, DOT_PRECISION, False, WIDE,
                                 ATTENTION_STAGES)
    row = (kvh * GROUP + groups) * SPLITS + split
    lse = tl.where(l_i > 0.0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(part_ptr + row[:, None] * D + full[None, :], out, mask=gmask)
    tl.store(lse_ptr + row, lse, mask=groups < GROUP)


@triton.jit
def _attention_rows(part_ptr, lse_ptr, first_head, HPS: tl.constexpr, NH: tl.constexpr, D: tl.constexpr,
                    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, dtype: tl.constexpr):
    """Attention's output for heads ``first_head .. +HPS`` as one vector ``[HPS * D]`` in ``dtype``: each head's
    slices weighted by their share of the softmax."""
    heads = first_head + tl.arange(0, HPS)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, D)
    mask = (heads < NH)[:, None] & (splits < SPLITS)[None, :]
    lse = tl.load(lse_ptr + heads[:, None] * SPLITS + splits[None, :], mask=mask, other=float("-inf"),
                  cache_modifier=".cg")
    top = tl.max(lse, 1)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top)[:, None])
    rows = heads[:, None] * SPLITS + splits[None, :]
    part = tl.load(part_ptr + rows[:, :, None] * D + dims[None, None, :], mask=mask[:, :, None], other=0.0,
                   cache_modifier=".cg")
    total = tl.sum(weight, 1)
    out = tl.sum(weight[:, :, None] * part, 1) / tl.where(total == 0.0, 1.0, total)[:, None]
    return tl.reshape(out.to(dtype).to(tl.float32), (HPS * D,))


# The step's inputs are read once each, so their addresses' alignment is not worth a variant of its own: a pass
# launches the variant the engine's start compiled wherever the staged inputs lie.
@triton.jit(**unaligned("ids_ptr", "pos_ptr", "slot_ptr", "block_row_ptr", "seq_len_ptr"))
def _persistent_decode_kernel(
    table_ptr, embed_ptr, final_norm_ptr, cos_ptr, sin_ptr, ids_ptr, pos_ptr, slot_ptr, block_row_ptr, seq_len_ptr,
    qkv_ptr, q_ptr, part_ptr, lse_ptr, po_ptr, act_ptr, pd_ptr, out_ptr, counter_ptr, err_ptr, times_ptr,
    LAYERS, v_offset, scale, eps, table_stride, max_spins,
    ROWS: tl.constexpr, BR: tl.constexpr,
    H: tl.constexpr, I: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr, BN: tl.constexpr,
    GU_ROWS: tl.constexpr, GU_TILE: tl.constexpr, D_ROWS: tl.constexpr, D_TILE: tl.constexpr, HPS: tl.constexpr,
    SPLIT_O: tl.constexpr, KS_D: tl.constexpr, KS_TILE: tl.constexpr, SPLIT_D: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
    QK_NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDE: tl.constexpr, ATTENTION_STAGES: tl.constexpr,
    PRELOAD: tl.constexpr, KV_AHEAD: tl.constexpr, Q_REGS: tl.constexpr, MLP_AHEAD: tl.constexpr,
    HEAD_WAITS: tl.constexpr, TIMED: tl.constexpr, dtype: tl.constexpr,
):
    """The pass over ``LAYERS`` layers for ``ROWS`` sequences' one token each (``BR``: the next power of 2), every
    program resident (see the module's docstring for the stages). Each weight tile a program reads serves every row.
    ``TIMED`` (GPU only): program 0 records the global timer after each barrier into ``times_ptr`` (1), or every
    program when it arrives and when it passes (2), for benchmarks. With ``HEAD_WAITS`` the first two stages end at
    no grid barrier: each qkv_proj unit adds its rows to their kv heads' counters, and an attention unit waits for its
    kv head's rows alone; each attention unit counts at its kv head, and an o_proj unit waits for the kv heads of its
    slice of the heads alone. (Such a stage's timeline records the program's pass as soon as its threads met.)"""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    D: tl.constexpr = 2 * HALF
    GROUP: tl.constexpr = NH // NKV
    QKV: tl.constexpr = (NH + 2 * NKV) * D
    COL_BLOCKS: tl.constexpr = H // BN
    U_QKV: tl.constexpr = (QKV + BN - 1) // BN
    U_ATTN_ROW: tl.constexpr = NKV * SPLITS
    U_ATTN: tl.constexpr = ROWS * U_ATTN_ROW
    U_O: tl.constexpr = COL_BLOCKS * SPLIT_O
    U_GATE_UP: tl.constexpr = (I + GU_ROWS - 1) // GU_ROWS
    D_BLOCKS: tl.constexpr = (H + D_ROWS - 1) // D_ROWS
    U_DOWN: tl.constexpr = D_BLOCKS * SPLIT_D
    # With HEAD_WAITS: qkv_proj's rows stored a kv head, then its attention units done. A program may then run stage 2
    # while others finish stage 1, or stage 3 while others finish stage 2: stage 2 writes the cache's new slot, the
    # query scratch and the slices' partial outputs, which stage 1 never reads, and stage 3 writes o_proj's partial sums,
    # which stage 2 never reads; what stage 2 reads (qkv) and stage 3 reads (the slices) is only overwritten a layer
    # later, after grid barriers every program must reach first.
    qkv_heads_ptr = counter_ptr + 2
    attn_heads_ptr = counter_ptr + 2 + NKV
    r = tl.arange(0, BR)
    cols = tl.arange(0, H)
    if ROWS == 1:
        seq_len0, pos0, slot0 = tl.load(seq_len_ptr), tl.load(pos_ptr), tl.load(slot_ptr)
    _record_time(times_ptr, 0, pid, G, TIMED)
    ids = tl.load(ids_ptr + r, mask=r < ROWS, other=0)
    h = tl.load(embed_ptr + ids[:, None] * H + cols[None, :], mask=(r < ROWS)[:, None], other=0.0).to(tl.float32)
    sync = 0
    # With PRELOAD each program reads its first unit's weight tile of a stage between the barrier's arrival and its
    # wait, so that the tile is on its way while the barrier completes (the first layer's qkv tile, here). Its bits
    # are the PRELOAD_* flags: 1 qkv_proj, 2 o_proj, 4 gate, 16 up, 8 down_proj.
    w_next = _read_ahead(_layer_tensor(table_ptr, 0, W_QKV, dtype), pid * BN, QKV, H, 0, H, BN, H, BN, H,
                         PRELOAD & 1)
    for layer in range(LAYERS):
        # 1. residual and norm, qkv_proj
        if layer > 0:
            h = _ordered_sum(h, pd_ptr, SPLIT_D, ROWS, BR, H, dtype)
        x = _rms_norm(h, _layer_tensor(table_ptr, layer, N_INPUT, dtype), eps, H, dtype)
        w_qkv = _layer_tensor(table_ptr, layer, W_QKV, dtype)
        for u in range(pid, U_QKV, G):
            w = _unit_tile(w_next, u, pid, w_qkv, u * BN, QKV, H, 0, H, BN, H, BN, H, PRELOAD & 1)
            for b in tl.static_range(ROWS):
                y, rows = _tile_times(w, u * BN, _row(x, b, BR), BN)
                tl.store(qkv_ptr + b * QKV + rows, y.to(dtype), mask=rows < QKV)
            if HEAD_WAITS:
                tl.debug_barrier()
                _qkv_rows_done(qkv_heads_ptr, u * BN, tl.minimum(u * BN + BN, QKV), NH, NKV, GROUP, D)
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED, HEAD_WAITS, not HEAD_WAITS)
        # 2. attention, each (row, kv head, slice)
        cache = _layer_tensor(table_ptr, layer, KV_CACHE, dtype)
        for u in range(pid, U_ATTN, G):
            if ROWS == 1:  # the one row's step inputs, read once at the start (read here, ptxas spilled 160 bytes)
                b = 0
                kvh, split = u % NKV, u // NKV
                seq_len, position, slot = seq_len0, pos0, slot0
            else:
                b = u // U_ATTN_ROW
                kvh, split = (u % U_ATTN_ROW) % NKV, (u % U_ATTN_ROW) // NKV
                seq_len, position, slot = tl.load(seq_len_ptr + b), tl.load(pos_ptr + b), tl.load(slot_ptr + b)
            lo, hi = _slice_keys(seq_len, split, SPLITS, BLOCK_N)
            if KV_AHEAD > 0:
                # the slice's first tiles asked into L2 before the query is made ready (and before the wait for its
                # rows), so that their round trip overlaps that work (the loop's own loads start only after it)
                _kv_into_l2(cache, v_offset, block_row_ptr + b * table_stride, kvh, lo, hi, KV_AHEAD * BLOCK_N, NKV, D,
                            PAGE, WIDE)
            if HEAD_WAITS:  # this kv head's rows of qkv_proj, every row's
                _wait(qkv_heads_ptr + kvh, err_ptr, (layer + 1) * (GROUP + 2) * D, max_spins, True)
            _attend_slice(qkv_ptr + b * QKV, q_ptr + b * NH * D, cache, v_offset, block_row_ptr + b * table_stride, kvh,
                          split, lo, hi, position, slot,
                          cos_ptr, sin_ptr, _layer_tensor(table_ptr, layer, N_Q, dtype),
                          _layer_tensor(table_ptr, layer, N_K, dtype), part_ptr + b * NH * SPLITS * D,
                          lse_ptr + b * NH * SPLITS, scale, eps, NH, NKV, HALF, GROUP,
                          BLOCK_G, SPLITS, BLOCK_N, PAGE, QK_NORM, DOT_PRECISION, WIDE, ATTENTION_STAGES, Q_REGS,
                          dtype)
            if HEAD_WAITS:
                tl.debug_barrier()
                tl.atomic_add(attn_heads_ptr + kvh, 1, sem="release", scope="gpu")
        _arrive(counter_ptr, times_ptr, sync + 1, pid, G, TIMED, not HEAD_WAITS)
        w_o = _layer_tensor(table_ptr, layer, W_O, dtype)
        o_row, o_col = (pid % COL_BLOCKS) * BN, (pid // COL_BLOCKS) * HPS * D  # the program's first unit
        o_pre = _read_ahead(w_o, o_row, H, NH * D, o_col, NH * D, BN, HPS * D, BN, HPS * D, PRELOAD & 2)
        sync = _stage_waited(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED, HEAD_WAITS,
                             not HEAD_WAITS)
        # 3. the slices combined, o_proj (column block, slice of the heads)
        for u in range(pid, U_O, G):
            s = u // COL_BLOCKS
            if HEAD_WAITS:  # every attention unit of the slice's kv heads, every row's
                for g in range((s * HPS) // GROUP, (tl.minimum(s * HPS + HPS, NH) - 1) // GROUP + 1):
                    _wait(attn_heads_ptr + g, err_ptr, (layer + 1) * SPLITS * ROWS, max_spins, True)
            # The first row's input asked for before the weight tile, as the one-row pass always did: after it, ptxas
            # spilled 196 bytes in the one-row launch (none this way; Triton 3.9 for sm_90, thirtieth session).
            attn0 = _attention_rows(part_ptr, lse_ptr, s * HPS, HPS, NH, D, SPLITS, BLOCK_S, dtype)
            w = _unit_tile(o_pre, u, pid, w_o, (u % COL_BLOCKS) * BN, H, NH * D, s * HPS * D, NH * D, BN, HPS * D,
                           BN, HPS * D, PRELOAD & 2)
            for b in tl.static_range(ROWS):
                attn = attn0
                if b > 0:
                    attn = _attention_rows(part_ptr + b * NH * SPLITS * D, lse_ptr + b * NH * SPLITS, s * HPS, HPS, NH,
                                           D, SPLITS, BLOCK_S, dtype)
                y, rows = _tile_times(w, (u % COL_BLOCKS) * BN, attn, BN)
                tl.store(po_ptr + (s * ROWS + b) * H + rows, y)
        _arrive(counter_ptr, times_ptr, sync + 1, pid, G, TIMED)
        w_gu = _layer_tensor(table_ptr, layer, W_GATE_UP, dtype)
        gate_pre = _read_ahead(w_gu, pid * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H, PRELOAD & 4)
        up_pre = _read_ahead(w_gu + I * H, pid * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H, PRELOAD & 16)
        sync = _stage_waited(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED, HEAD_WAITS)
        # 4. residual and norm, gate_up_proj, SiLU-and-mul
        h = _ordered_sum(h, po_ptr, SPLIT_O, ROWS, BR, H, dtype)
        x = _rms_norm(h, _layer_tensor(table_ptr, layer, N_POST, dtype), eps, H, dtype)
        if MLP_AHEAD:  # the program's first unit's tiles; each later unit's are asked for a unit ahead, below
            wg = _unit_tile(gate_pre, pid, pid, w_gu, pid * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H, PRELOAD & 4)
            wu = _unit_tile(up_pre, pid, pid, w_gu + I * H, pid * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H,
                            PRELOAD & 16)
        for u in range(pid, U_GATE_UP, G):
            if MLP_AHEAD:
                # the next unit's tiles asked for before this one's are summed (rows past I, past the last unit, read
                # nothing)
                wg_next = _tile(w_gu, (u + G) * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H)
                wu_next = _tile(w_gu + I * H, (u + G) * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H)
            else:
                # both tiles asked for before either is summed
                wg = _unit_tile(gate_pre, u, pid, w_gu, u * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H, PRELOAD & 4)
                wu = _unit_tile(up_pre, u, pid, w_gu + I * H, u * GU_ROWS, I, H, 0, H, GU_TILE, H, GU_ROWS, H,
                                PRELOAD & 16)
            for b in tl.static_range(ROWS):
                xb = _row(x, b, BR)
                gate, rows = _tile_times(wg, u * GU_ROWS, xb, GU_TILE)
                up, _ = _tile_times(wu, u * GU_ROWS, xb, GU_TILE)
                gate = gate.to(dtype).to(tl.float32)
                silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
                tl.store(act_ptr + b * I + rows, (silu * up.to(dtype).to(tl.float32)).to(dtype),
                         mask=(rows < I) & (tl.arange(0, GU_TILE) < GU_ROWS))
            if MLP_AHEAD:
                wg, wu = wg_next, wu_next
        _arrive(counter_ptr, times_ptr, sync + 1, pid, G, TIMED)
        w_down = _layer_tensor(table_ptr, layer, W_DOWN, dtype)
        d_row, d_col = (pid % D_BLOCKS) * D_ROWS, (pid // D_BLOCKS) * KS_D  # the program's first unit
        down_pre = _read_ahead(w_down, d_row, H, I, d_col, I, D_TILE, KS_TILE, D_ROWS, KS_D, PRELOAD & 8)
        sync = _stage_waited(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED, HEAD_WAITS)
        # 5. down_proj (column block, slice of K)
        for u in range(pid, U_DOWN, G):
            s = u // D_BLOCKS
            k = tl.arange(0, KS_TILE)
            # the first row's activation before the tile, as o_proj's
            a0 = tl.load(act_ptr + s * KS_D + k, mask=(s * KS_D + k < I) & (k < KS_D), other=0.0,
                         cache_modifier=".cg").to(tl.float32)
            w = _unit_tile(down_pre, u, pid, w_down, (u % D_BLOCKS) * D_ROWS, H, I, s * KS_D, I, D_TILE, KS_TILE, D_ROWS,
                           KS_D, PRELOAD & 8)
            for b in tl.static_range(ROWS):
                a = a0
                if b > 0:
                    a = tl.load(act_ptr + b * I + s * KS_D + k, mask=(s * KS_D + k < I) & (k < KS_D), other=0.0,
                                cache_modifier=".cg").to(tl.float32)
                y, rows = _tile_times(w, (u % D_BLOCKS) * D_ROWS, a, D_TILE)
                tl.store(pd_ptr + (s * ROWS + b) * H + rows, y, mask=(rows < H) & (tl.arange(0, D_TILE) < D_ROWS))
        _arrive(counter_ptr, times_ptr, sync + 1, pid, G, TIMED)
        # the next layer's qkv tile (none after the last layer: every row masked)
        following = _layer_tensor(table_ptr, tl.minimum(layer + 1, LAYERS - 1), W_QKV, dtype)
        more = tl.where(layer + 1 < LAYERS, QKV, 0)
        w_next = _read_ahead(following, pid * BN, more, H, 0, H, BN, H, BN, H, PRELOAD & 1)
        sync = _stage_waited(counter_ptr, err_ptr, times_ptr, sync, pid, G, max_spins, TIMED, HEAD_WAITS)
    if pid == 0:
        h = _ordered_sum(h, pd_ptr, SPLIT_D, ROWS, BR, H, dtype)
        tl.store(out_ptr + r[:, None] * H + cols[None, :], _rms_norm(h, final_norm_ptr, eps, H, dtype).to(dtype),
                 mask=(r < ROWS)[:, None])
    # The last program out resets the counters for the next launch: every program has passed its last barrier (and
    # every head's wait before it).
    if tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")
        if HEAD_WAITS:
            for g in range(2 * NKV):
                tl.atomic_xchg(qkv_heads_ptr + g, 0, sem="relaxed", scope="gpu")


def _power_of_2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class PersistentDecode:
    """The launch for one model and its KV caches: a pointer table of each layer's tensors, and the scratch the
    stages hand over through. ``__call__`` runs a pass for ``rows`` sequences' one token each and returns their final
    hidden states ``[rows, hidden]`` (after the model's last norm), as the model's forward would.

    The launch reads the model's weights and the caches by their addresses, so it holds a reference to each tensor whose
    address its table keeps (a cache dropped by its caller would otherwise be freed under it), and must be made again
    if either is replaced. The launch's defaults are the fastest measured (benchmarks/README.md, "A lone request's decode pass as one
    persistent kernel", on an H200, and the twenty-third to twenty-sixth sessions, on an H100): two programs an SM of 4
    warps where the GPU holds them at once (else one an SM), 32 keys a step in an attention loop of 5 stages, qkv_proj's
    and o_proj's products in units of 16 rows at Qwen3-0.6B's width and gate_up_proj's and down_proj's in units of 4,
    every product's first weight tile read ahead of its barrier's wait and gate_up_proj's next unit's tiles asked for
    while the current one's are summed, each attention unit's query in registers and its cache's first tile asked into
    L2, and attention's and o_proj's units waiting for their own kv heads rather than grid barriers
    (``PERSISTENT_CONFIG``, the twenty-fourth to fortieth sessions). The arguments exist for tests and
    benchmarks: ``preload`` (the products whose first weight tile each program reads ahead between the barrier's
    arrival and its wait, ``PRELOAD_*`` flags), ``num_programs`` (one under the interpreter),
    ``splits`` (slices of the context a kv head; default: as many as fill the programs), ``block_n``, ``num_warps``,
    ``num_stages``, ``attention_stages`` (the attention loop's own, else ``num_stages``), the units' sizes
    (``rows_per_unit`` of qkv_proj and o_proj, ``mlp_rows_per_unit`` of gate_up_proj, ``heads_per_slice`` of o_proj's K,
    ``down_rows_per_unit`` and the width ``down_slice`` of down_proj's slices of K), and ``timed`` (GPU only: each pass
    records when each stage ended, ``stage_us``; ``"programs"``: when each program arrived at and passed each barrier,
    ``program_times``). ``block_n``, ``attention_stages``, ``mlp_rows_per_unit``,
    ``down_rows_per_unit``, ``down_slice``, ``splits``, ``preload``, ``kv_ahead`` (tiles of its slice of the cache an
    attention unit asks into L2 before it makes its query ready; GPU only: the default is 0 on CPU) and
    ``q_in_registers`` (its query's rotated halves joined in registers, not through global memory), ``mlp_ahead``
    (gate_up_proj's next unit's tiles asked for before the current one's are summed) and ``head_waits`` (attention's
    and o_proj's units wait for their own kv heads' inputs instead of a grid barrier) left unset take
    ``PERSISTENT_CONFIG``'s; a size or a count of 0 is the launch's own choice, as there."""

    max_context = MAX_CONTEXT
    programs_per_sm = 2

    def __init__(self, model, kv_caches: list[torch.Tensor], num_programs: int | None = None, splits: int | None = None,
                 block_n: int | None = None, num_warps: int = 4, num_stages: int = 2, attention_stages: int | None = None,
                 timed: bool | str = False, rows_per_unit: int | None = None, mlp_rows_per_unit: int | None = None,
                 heads_per_slice: int | None = None, down_rows_per_unit: int | None = None,
                 down_slice: int | None = None, preload: int | None = None,
                 kv_ahead: int | None = None, q_in_registers: bool | None = None, mlp_ahead: bool | None = None,
                 head_waits: bool | None = None, rows: int = 1) -> None:
        reason = self.unsupported(model, kv_caches)
        if reason:
            raise ValueError(f"persistent decode: {reason}")
        if not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
            raise ValueError(f"persistent decode: rows must be from 1 to {MAX_ROWS}, got {rows!r}")
        self.rows = rows
        given = dict(block_n=block_n, attention_stages=attention_stages, mlp_rows_per_unit=mlp_rows_per_unit,
                     down_rows_per_unit=down_rows_per_unit, down_slice=down_slice, splits=splits, preload=preload,
                     kv_ahead=kv_ahead, q_in_registers=q_in_registers, mlp_ahead=mlp_ahead, head_waits=head_waits)
        # A setting left unset takes PERSISTENT_CONFIG's; 0 is the launch's own choice there and here alike.
        settings = {key: PERSISTENT_CONFIG[key] if value is None else value for key, value in given.items()}
        on_gpu = kv_caches[0].device.type == "cuda"
        if kv_ahead is None and not on_gpu:
            settings["kv_ahead"] = 0  # the default asks a GPU's L2: off on the CPU, where asking for it is refused
        if settings["kv_ahead"] and not on_gpu:
            raise ValueError(f"persistent decode: kv_ahead ({settings['kv_ahead']}) asks a GPU's L2 for the cache's "
                             "lines: GPU only")
        config = model.config
        attn = model.layers[0].self_attn
        device = kv_caches[0].device
        self.dtype = kv_caches[0].dtype
        self.hidden = config.hidden_size
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.inter = model.layers[0].mlp.down_proj.weight.shape[1]
        self.eps, self.scale, self.qk_norm = float(config.rms_norm_eps), float(attn.attn.scale), attn.q_norm is not None
        self.page = kv_caches[0].shape[2]
        self.v_offset = kv_caches[0][1].data_ptr() // self.dtype.itemsize - kv_caches[0][0].data_ptr() // self.dtype.itemsize
        self.launch = dict(num_warps=num_warps, num_stages=num_stages)
        # A unit's weight tile is at most 16K elements: 32 KiB of bf16, 64 registers a thread at 4 warps.
        self.bn = min(rows_per_unit or max(16, min(64, 16384 // self.hidden)), self.hidden)  # column blocks of H
        # gate_up_proj and down_proj take units of their own size (``mlp_rows_per_unit``, 4 by default), of any number
        # of rows and down_proj's K in slices of any width, each read in a tile of the next power of 2: where every
        # product had 8-row units, o_proj lost more than the others gained (3.1 to 5.4 us a layer on an H100: each
        # unit combines its heads' attention slices again; benchmarks/README.md, twenty-third session).
        self.gate_up_rows = settings["mlp_rows_per_unit"] or self.bn
        self.down_rows = settings["down_rows_per_unit"] or self.gate_up_rows
        # down_proj's K in as few even slices as keep a unit's tile within 32K elements, each a multiple of 16 wide:
        # with 4-row units Qwen3-0.6B's 3,072 is one slice (a tile of 4,096 columns, three quarters used).
        widest = max(16, 32768 // triton.next_power_of_2(self.down_rows))
        self.ks_down = settings["down_slice"] or 16 * -(-self.inter // (16 * -(-self.inter // widest)))
        self.heads_per_slice = heads_per_slice or min(triton.next_power_of_2(self.heads), max(1, 512 // self.head_dim))
        for name, value in (("block_n", settings["block_n"]), ("rows_per_unit", self.bn),
                            ("heads_per_slice", self.heads_per_slice)):
            if not _power_of_2(value):
                raise ValueError(f"persistent decode: {name} must be a power of 2, got {value}")
        for name, value, limit in (("mlp_rows_per_unit", self.gate_up_rows, self.inter),
                                   ("down_rows_per_unit", self.down_rows, self.hidden),
                                   ("down_slice", self.ks_down, self.inter)):
            if not 1 <= value <= limit:
                raise ValueError(f"persistent decode: {name} must be from 1 to {limit}, got {value}")
        pointers = []
        for layer, cache in zip(model.layers, kv_caches):
            a, m = layer.self_attn, layer.mlp
            norms = (a.q_norm.weight, a.k_norm.weight) if self.qk_norm else (layer.input_layernorm.weight,) * 2
            tensors = (a.qkv_proj.weight, a.o_proj.weight, m.gate_up_proj.weight, m.down_proj.weight,
                       layer.input_layernorm.weight, layer.post_attention_layernorm.weight, *norms, cache)
            pointers.append([t.data_ptr() for t in tensors])
        self.table = torch.tensor(pointers, dtype=torch.int64, device=device)
        self.held = (list(model.parameters()), list(kv_caches))  # what the table's addresses point into
        self.embed = model.embed_tokens.weight
        self.final_norm = model.norm.weight
        self.cos, self.sin = attn.rotary.cos_cache, attn.rotary.sin_cache
        slices_o = -(-self.heads // self.heads_per_slice)
        slices_down = -(-self.inter // self.ks_down)
        f32 = dict(dtype=torch.float32, device=device)
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv = torch.empty(rows, qkv_width, dtype=self.dtype, device=device)
        self.q = torch.empty(rows, self.heads, self.head_dim, dtype=self.dtype, device=device)
        self.po = torch.empty(slices_o, rows, self.hidden, **f32)
        self.act = torch.empty(rows, self.inter, dtype=self.dtype, device=device)
        self.pd = torch.empty(slices_down, rows, self.hidden, **f32)
        self.out = torch.empty(rows, self.hidden, dtype=self.dtype, device=device)
        # The grid's barrier and the launch's exit, then (``head_waits``) each kv head's qkv_proj rows and attention units.
        self.counters = torch.zeros(2 + 2 * self.kv_heads, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)
        if timed not in (False, True, "programs"):
            raise ValueError(f"persistent decode: timed must be False, True or 'programs', got {timed!r}")
        self.timed = 2 if timed == "programs" else int(timed)
        self.constexprs = dict(
            ROWS=rows, BR=triton.next_power_of_2(rows), H=self.hidden, I=self.inter, NH=self.heads, NKV=self.kv_heads, HALF=self.head_dim // 2, BN=self.bn,
            GU_ROWS=self.gate_up_rows, GU_TILE=triton.next_power_of_2(self.gate_up_rows), D_ROWS=self.down_rows,
            D_TILE=triton.next_power_of_2(self.down_rows), HPS=self.heads_per_slice, SPLIT_O=slices_o, KS_D=self.ks_down,
            KS_TILE=triton.next_power_of_2(self.ks_down), SPLIT_D=slices_down,
            BLOCK_G=max(16, triton.next_power_of_2(self.heads // self.kv_heads)), BLOCK_N=settings["block_n"],
            PAGE=self.page, QK_NORM=self.qk_norm, DOT_PRECISION="ieee" if self.dtype == torch.float32 else "tf32",
            WIDE=any(wide_offsets(cache[0]) for cache in kv_caches), ATTENTION_STAGES=settings["attention_stages"] or None,
            PRELOAD=settings["preload"], KV_AHEAD=settings["kv_ahead"], Q_REGS=bool(settings["q_in_registers"]),
            MLP_AHEAD=bool(settings["mlp_ahead"]), HEAD_WAITS=bool(settings["head_waits"]),
            TIMED=self.timed, dtype={torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[self.dtype],
        )
        if device.type != "cuda":
            self._configure(num_programs or 1, settings["splits"])
            return
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self._configure(num_programs or self.programs_per_sm * sms, settings["splits"])
        held = self._programs_held(device, sms)
        if self.num_programs > held:
            if num_programs is not None:
                raise ValueError(f"persistent decode: num_programs ({num_programs}) exceeds the {held} the GPU holds at "
                                 "once: its barriers would wait for programs that never start")
            self._configure(sms, settings["splits"])  # one an SM always fits: a compiled program fits an SM

    def _configure(self, num_programs: int, splits: int | None) -> None:
        """The grid, and the context's slices a (row, kv head) (as many as fill it), with their scratch."""
        self.num_programs = num_programs
        self.splits = splits or max(1, 1 << (max(1, num_programs // (self.kv_heads * self.rows)).bit_length() - 1))
        device = self.table.device
        self.part = torch.empty(self.rows * self.heads * self.splits, self.head_dim, dtype=torch.float32, device=device)
        self.lse = torch.empty(self.rows * self.heads * self.splits, dtype=torch.float32, device=device)
        barriers = 5 * self.table.shape[0] + 1  # the launch's start, then each barrier
        self.times = torch.zeros(barriers * (num_programs * 2 if self.timed == 2 else 1), dtype=torch.int64,
                                 device=device)
        self.constexprs.update(SPLITS=self.splits, BLOCK_S=triton.next_power_of_2(self.splits))

    @staticmethod
    def unsupported(model, kv_caches: list[torch.Tensor]) -> str | None:
        """Why this model cannot run its decode pass in one launch (None: it can)."""
        from raygrid.parallel.groups import get_pp_group, get_tp_group

        config = model.config
        if get_tp_group().world_size > 1 or get_pp_group().world_size > 1:
            return "only one device (no tensor or pipeline parallelism)"
        if not model.layers or len(kv_caches) != len(model.layers):
            return "the model needs its layers and one KV cache each"
        attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
        if not hasattr(mlp, "gate_up_proj") or getattr(attn, "qkv_proj", None) is None:
            return "only dense Llama-family layers (no mixture of experts)"
        hidden, head_dim = config.hidden_size, attn.head_dim
        if not _power_of_2(hidden) or hidden > 2048:
            return f"hidden_size must be a power of 2 up to 2048, got {hidden}"
        if not _power_of_2(head_dim) or not 16 <= head_dim <= 256:
            return f"head_dim must be a power of 2 from 16 to 256 (tensor-core products), got {head_dim}"
        dtype = kv_caches[0].dtype
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            linears = (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)
            if any(linear.weight.dtype != dtype or linear.bias is not None for linear in linears):
                return "only unquantized linear layers without bias, in the KV cache's dtype"
            if any(not linear.weight.is_contiguous() for linear in linears):
                return "linear weights must be contiguous"
        if any(not cache.is_contiguous() or cache.dtype != dtype for cache in kv_caches):
            return "KV caches must be contiguous and all of one dtype"
        if model.embed_tokens is None or model.norm is None or model.embed_tokens.weight.dtype != dtype:
            return "the model needs its embedding and final norm in the cache's dtype"
        return None

    def _arguments(self, input_ids, positions, slot_mapping, block_tables, seq_lens) -> tuple:
        return (self.table, self.embed, self.final_norm, self.cos, self.sin, input_ids, positions, slot_mapping, block_tables,
                seq_lens, self.qkv, self.q, self.part, self.lse, self.po, self.act, self.pd, self.out, self.counters,
                self.error, self.times, self.table.shape[0], self.v_offset, self.scale, self.eps, block_tables.stride(0),
                MAX_SPINS if self.table.device.type == "cuda" else MAX_SPINS_INTERPRETED)

    def _programs_held(self, device: torch.device, sms: int) -> int:
        """How many programs of this launch the GPU holds at once, from the compiled kernel's registers and shared
        memory and the SM's (as Triton's driver reports them). A grid beyond it would never finish its barriers."""
        from triton.runtime import driver

        step = torch.zeros(self.rows, dtype=torch.long, device=device)
        kernel = _persistent_decode_kernel.warmup(
            *self._arguments(step, step, step, torch.zeros(self.rows, 1, dtype=torch.int32, device=device), step.int()),
            grid=(self.num_programs,), **self.launch, **self.constexprs)
        kernel._init_handles()
        sm = driver.active.utils.get_device_properties(device.index if device.index is not None else torch.cuda.current_device())
        warps = self.launch["num_warps"]
        registers = -(-kernel.n_regs * 32 // 256) * 256 * warps  # allocated a warp at a time, 256 at once
        per_sm = min(sm["max_num_regs"] // max(registers, 1), sm["max_shared_mem"] // max(kernel.metadata.shared, 1),
                     64 // warps)
        return max(per_sm, 1) * sms

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """The final hidden states ``[rows, hidden]`` of ``rows`` sequences' one new token each (``seq_lens`` counts
        it; ``block_tables``: a row a sequence)."""
        if input_ids.shape[0] != self.rows:
            raise ValueError(f"persistent decode: a launch for {self.rows} rows got {input_ids.shape[0]} tokens")
        _persistent_decode_kernel[(self.num_programs,)](
            *self._arguments(input_ids, positions, slot_mapping, block_tables, seq_lens), **self.launch, **self.constexprs)
        return self.out

    def stage_us(self) -> list[float]:
        """With ``timed``: the last pass's five stages, each one's mean over the layers in microseconds (qkv,
        attention, o_proj, gate_up, down; each up to the barrier after it; program 0's view)."""
        ends = self.times.tolist() if self.timed == 1 else self.program_times()[:, 0, 1].tolist()
        steps = [(b - a) / 1e3 for a, b in zip(ends, ends[1:])]
        return [sum(steps[i::5]) / len(steps[i::5]) for i in range(5)]

    def program_times(self) -> torch.Tensor:
        """With ``timed="programs"``: the last pass's timeline, ``[barriers + 1, programs, 2]`` int64 ns from the
        earliest program's start: for barrier ``k`` (0 the launch's start; then five a layer, each after its stage)
        when each program's threads met before its arrival (``[k, p, 0]``; for 0, the SM it ran on) and when it
        passed (``[k, p, 1]``)."""
        if self.timed != 2:
            raise ValueError("persistent decode: program_times needs timed='programs'")
        times = self.times.view(-1, self.num_programs, 2).cpu()
        sms = times[0, :, 0].clone()
        times = times - times[0, :, 1].min()
        times[0, :, 0] = sms
        return times

    def check(self) -> None:
        """Raise if a barrier of any pass so far waited past its limit (programs not all resident): those passes'
        results are wrong."""
        if int(self.error.item()):
            raise RuntimeError("persistent decode: a grid barrier timed out; its programs were not all resident")
