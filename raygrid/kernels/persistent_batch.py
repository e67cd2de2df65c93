"""A decode pass of a small batch (a few to 64 sequences, one token each) in one persistent launch, its products on
the tensor cores.

``persistent_decode`` runs the pass of one or two sequences in one launch: every program keeps its own copy of each
row's residual stream in registers and multiplies each weight tile with each row in turn on the CUDA cores. Past two
rows that lost to the layer-by-layer pass (registers spill, and each row repeats the multiply; benchmarks/README.md,
thirtieth session). Here the rows are the M side of ``tl.dot`` products (padded to ``BM``, at least 16), and the
residual stream lives in global memory (L2), each column block of it owned by the unit that writes it:

0. the embeddings of the step's tokens into the residual stream ``h`` (``[BM, H]``, the model's dtype);
1. RMSNorm and qkv_proj, units of ``BN`` output columns: each unit makes the normed input chunk by chunk of K from
   ``h`` and the row sums of squares the last stage left per column block (``ss``), so no program needs a whole row;
2. attention, a unit per (row, kv head, slice of the context), as the one-row pass's (q/k norms and rotary, the
   token's key and value into the cache); the last slice of a (row, kv head) to finish combines its heads' slices
   into attention's output (``attn``, the model's dtype);
3. o_proj, units of (``BN`` output columns, a slice of K); the last slice of a column block to finish adds the
   slices' sums in order, adds the block to ``h`` and writes its row sums of squares;
4. RMSNorm, gate_up_proj and SiLU-and-mul, units of ``GU`` columns of each;
5. down_proj as o_proj.

Stages meet at grid-wide barriers (``persistent_decode._arrive``/``_wait``). "The last to finish" is an arrival
counter a column block (or a (row, kv head)), as the skinny linear kernel's split-K: whoever arrives last, the slices
are added in one order, so a pass gives the same bits every time; the last sets its counter back to 0. Roundings
follow the engine's kernels, as the one-row pass's do (the residual stream, the norms, qkv, attention's output, each
product, SiLU and the activation rounded to the model's dtype where the layer-by-layer pass rounds them), so the two
agree to that dtype's rounding; the sums of squares and products add in another order than the engine's kernels.
Under Triton's interpreter one program does every unit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.persistent_decode import (
    _NO_ALIGNMENT, KV_CACHE, N_INPUT, N_K, N_POST, N_Q, PERSISTENT_CONFIG, W_DOWN, W_GATE_UP, W_O, W_QKV, PersistentPass,
    _attend_slice,
    _layer_tensor, _record_time, _stage_end,
)
from raygrid.kernels.triton_attention import overridden

# The most rows a launch takes (its M side padded to a power of 2 from 16).
MAX_BATCH_ROWS = 64
# The launch's defaults, with the environment's RAYGRID_PERSISTENT_BATCH_CONFIG (JSON) over them for benchmarks:
# output columns a unit of qkv_proj, o_proj and down_proj (``block_n``) and of gate_up_proj (``gate_up_cols``, of
# gate and of up each), K a step of a product (``k_chunk``), slices of K of o_proj and down_proj (0: as many as give
# about one unit a program), slices of the context a (row, kv head) (0: as many as fill the programs), the attention
# loop's stages, and the batch sizes the engine takes it for (``min_rows`` to ``max_rows``; 0 turns it off).
BATCH_CONFIG = overridden(dict(block_n=16, gate_up_cols=16, k_chunk=128, o_slices=0, down_slices=0, splits=0,
                               attention_stages=5, min_rows=3, max_rows=0), "RAYGRID_PERSISTENT_BATCH_CONFIG")


@triton.jit
def _inv_rms(ss_ptr, eps, BM: tl.constexpr, CB: tl.constexpr, BCB: tl.constexpr, H: tl.constexpr):
    """Each row's 1 / RMS (``[BM]``) from the column blocks' row sums of squares (``[CB, BM]``), added in one order."""
    c = tl.arange(0, BCB)
    ss = tl.load(ss_ptr + c[:, None] * BM + tl.arange(0, BM)[None, :], mask=(c < CB)[:, None], other=0.0,
                 cache_modifier=".cg")
    return tl.rsqrt(tl.sum(ss, 0) / H + eps)


@triton.jit
def _normed(h_ptr, inv, norm_ptr, k, ROWS, BM: tl.constexpr, H: tl.constexpr, dtype: tl.constexpr):
    """Columns ``k`` of RMSNorm(h) for every row (``[BM, len(k)]``, ``dtype``), rounded as the engine's kernel."""
    r = tl.arange(0, BM)
    h = tl.load(h_ptr + r[:, None] * H + k[None, :], mask=(r < ROWS)[:, None], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    y = (h * inv[:, None]).to(dtype).to(tl.float32)
    return (tl.load(norm_ptr + k).to(tl.float32)[None, :] * y).to(dtype)


@triton.jit
def _normed_product(h_ptr, inv, norm_ptr, w_ptr, n0, N, ROWS, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                    KC: tl.constexpr, PAIR: tl.constexpr, DOT_PRECISION: tl.constexpr, dtype: tl.constexpr):
    """RMSNorm(h) times rows ``n0 .. n0+BN`` of the ``[N, H]`` weight, transposed: ``[BM, BN]`` in float32. With
    ``PAIR`` also times the same rows of the ``[N, H]`` weight after it (gate_up_proj's up), each chunk of the normed
    input made once for both; the second product is 0 without."""
    n = n0 + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    second = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, H, KC):
        k = k0 + tl.arange(0, KC)
        x = _normed(h_ptr, inv, norm_ptr, k, ROWS, BM, H, dtype)
        tile = w_ptr + n[:, None] * H + k[None, :]
        w = tl.load(tile, mask=(n < N)[:, None], other=0.0)
        if PAIR:
            w2 = tl.load(tile + N * H, mask=(n < N)[:, None], other=0.0)  # both tiles asked for before either is used
            second = tl.dot(x, tl.trans(w2), second, input_precision=DOT_PRECISION)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc, second


@triton.jit
def _product(x_ptr, K, w_ptr, n0, N, k_start, k_end, ROWS, BM: tl.constexpr, BN: tl.constexpr, KC: tl.constexpr,
             DOT_PRECISION: tl.constexpr):
    """Columns ``k_start .. k_end`` of ``x`` (``[BM, K]``, written by another program) times the same columns of rows
    ``n0 .. n0+BN`` of the ``[N, K]`` weight, transposed: ``[BM, BN]`` in float32."""
    r = tl.arange(0, BM)
    n = n0 + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(k_start, k_end, KC):
        k = k0 + tl.arange(0, KC)
        x = tl.load(x_ptr + r[:, None] * K + k[None, :], mask=(r < ROWS)[:, None] & (k < k_end)[None, :], other=0.0,
                    cache_modifier=".cg")
        w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n < N)[:, None] & (k < k_end)[None, :], other=0.0)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _store_block(h, h_ptr, ss_ptr, c, ROWS, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr):
    """Column block ``c`` of the residual stream (``h``, ``[BM, BN]`` in the model's dtype) stored, and its row sums of
    squares into ``ss[c]``."""
    r = tl.arange(0, BM)
    tl.store(h_ptr + r[:, None] * H + c * BN + tl.arange(0, BN)[None, :], h, mask=(r < ROWS)[:, None])
    h = h.to(tl.float32)
    tl.store(ss_ptr + c * BM + r, tl.sum(h * h, 1))


@triton.jit
def _into_stream(total, h_ptr, ss_ptr, c, ROWS, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                 dtype: tl.constexpr):
    """A product's column block ``c`` (``total``, float32) rounded, added to the residual stream and rounded."""
    r = tl.arange(0, BM)
    h = tl.load(h_ptr + r[:, None] * H + c * BN + tl.arange(0, BN)[None, :], mask=(r < ROWS)[:, None], other=0.0,
                cache_modifier=".cg").to(tl.float32)
    _store_block((h + total.to(dtype).to(tl.float32)).to(dtype), h_ptr, ss_ptr, c, ROWS, BM, BN, H)


@triton.jit
def _finish_block(acc, h_ptr, ss_ptr, part_ptr, arrivals_ptr, c, s, ROWS, SPLIT: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, H: tl.constexpr, dtype: tl.constexpr):
    """Slice ``s`` of K's sums for column block ``c``: with one slice into the stream now; with several stored, and the
    slice that arrives last at the block's counter adds them all in order into the stream and sets it back to 0."""
    if SPLIT == 1:
        _into_stream(acc, h_ptr, ss_ptr, c, ROWS, BM, BN, H, dtype)
    else:
        offs = tl.arange(0, BM)[:, None] * H + c * BN + tl.arange(0, BN)[None, :]
        tl.store(part_ptr + s * BM * H + offs, acc)
        tl.debug_barrier()  # every thread's stores before the one thread's release (the atomic below)
        if tl.atomic_add(arrivals_ptr + c, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            total = tl.load(part_ptr + offs, cache_modifier=".cg")
            for t in tl.static_range(1, SPLIT):
                total += tl.load(part_ptr + t * BM * H + offs, cache_modifier=".cg")
            _into_stream(total, h_ptr, ss_ptr, c, ROWS, BM, BN, H, dtype)
            tl.atomic_xchg(arrivals_ptr + c, 0, sem="relaxed", scope="gpu")


@triton.jit
def _combine_heads(part_ptr, lse_ptr, attn_ptr, first, GROUP: tl.constexpr, SPLITS: tl.constexpr,
                   BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr, dtype: tl.constexpr):
    """Attention's output for heads ``first .. first+GROUP`` of a row (``[NH, SPLITS, D]`` slices and their log-sum-
    exps at ``part_ptr``/``lse_ptr``): each slice weighted by its share of the softmax, into ``attn_ptr`` (``[NH, D]``)."""
    g = tl.arange(0, BLOCK_G)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    heads = first + g
    in_group = (g < GROUP)[:, None]
    lse = tl.load(lse_ptr + heads[:, None] * SPLITS + s[None, :], mask=in_group & (s < SPLITS)[None, :],
                  other=float("-inf"), cache_modifier=".cg")
    top = tl.max(lse, 1)
    weight = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top)[:, None])
    out = tl.zeros([BLOCK_G, D], dtype=tl.float32)
    for t in tl.static_range(SPLITS):
        share = tl.sum(tl.where(s[None, :] == t, weight, 0.0), 1)
        out += share[:, None] * tl.load(part_ptr + (heads[:, None] * SPLITS + t) * D + d[None, :], mask=in_group,
                                        other=0.0, cache_modifier=".cg")
    total = tl.sum(weight, 1)
    out = out / tl.where(total == 0.0, 1.0, total)[:, None]
    tl.store(attn_ptr + heads[:, None] * D + d[None, :], out.to(dtype), mask=in_group)


@triton.jit(do_not_specialize=["ROWS"], **_NO_ALIGNMENT)
def _persistent_batch_kernel(
    table_ptr, embed_ptr, final_norm_ptr, cos_ptr, sin_ptr, ids_ptr, pos_ptr, slot_ptr, block_row_ptr, seq_len_ptr,
    h_ptr, ss_ptr, qkv_ptr, q_ptr, part_ptr, lse_ptr, attn_ptr, po_ptr, act_ptr, pd_ptr, arrivals_ptr, out_ptr,
    counter_ptr, err_ptr, times_ptr,
    ROWS, LAYERS, v_offset, scale, eps, table_stride,
    BM: tl.constexpr, H: tl.constexpr, I: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr,
    BN: tl.constexpr, GU: tl.constexpr, KC: tl.constexpr, SPLIT_O: tl.constexpr, KS_O: tl.constexpr,
    SPLIT_D: tl.constexpr, KS_D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, PAGE: tl.constexpr, QK_NORM: tl.constexpr, DOT_PRECISION: tl.constexpr, WIDE: tl.constexpr,
    ATTENTION_STAGES: tl.constexpr, TIMED: tl.constexpr, dtype: tl.constexpr,
):
    """The pass over ``LAYERS`` layers for ``ROWS`` (at most ``BM``) sequences' one token each, every program resident
    (the module's docstring has the stages). ``TIMED`` (GPU only): program 0 records the global timer after each
    barrier into ``times_ptr``."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    D: tl.constexpr = 2 * HALF
    GROUP: tl.constexpr = NH // NKV
    QKV: tl.constexpr = (NH + 2 * NKV) * D
    CB: tl.constexpr = H // BN  # column blocks of the residual stream
    BCB: tl.constexpr = triton.next_power_of_2(CB)
    r = tl.arange(0, BM)
    rows = (r < ROWS)[:, None]
    ss_o = ss_ptr  # row sums of squares a column block: after o_proj (read by stage 4) ...
    ss_d = ss_ptr + CB * BM  # ... and after down_proj or the embeddings (read by stage 1)
    attention_arrivals = arrivals_ptr
    o_arrivals = arrivals_ptr + BM * NKV
    down_arrivals = o_arrivals + CB
    _record_time(times_ptr, 0, pid, TIMED)
    # 0. the embeddings into the residual stream
    ids = tl.load(ids_ptr + r, mask=r < ROWS, other=0)
    for c in range(pid, CB, G):
        e = tl.load(embed_ptr + ids[:, None] * H + c * BN + tl.arange(0, BN)[None, :], mask=rows, other=0.0)
        _store_block(e, h_ptr, ss_d, c, ROWS, BM, BN, H)
    sync = _stage_end(counter_ptr, err_ptr, times_ptr, 0, pid, G, TIMED)
    for layer in range(LAYERS):
        # 1. RMSNorm and qkv_proj
        inv = _inv_rms(ss_d, eps, BM, CB, BCB, H)
        w_qkv = _layer_tensor(table_ptr, layer, W_QKV, dtype)
        norm = _layer_tensor(table_ptr, layer, N_INPUT, dtype)
        for u in range(pid, (QKV + BN - 1) // BN, G):
            acc, _ = _normed_product(h_ptr, inv, norm, w_qkv, u * BN, QKV, ROWS, BM, BN, H, KC, False, DOT_PRECISION,
                                     dtype)
            cols = u * BN + tl.arange(0, BN)
            tl.store(qkv_ptr + r[:, None] * QKV + cols[None, :], acc.to(dtype), mask=rows & (cols < QKV)[None, :])
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, TIMED)
        # 2. attention, each (row, kv head, slice); the last slice of a (row, kv head) combines its heads
        cache = _layer_tensor(table_ptr, layer, KV_CACHE, dtype)
        for u in range(pid, ROWS * NKV * SPLITS, G):
            b = u // (NKV * SPLITS)
            kvh, split = (u % (NKV * SPLITS)) % NKV, (u % (NKV * SPLITS)) // NKV
            part = part_ptr + b * NH * SPLITS * D
            lse = lse_ptr + b * NH * SPLITS
            _attend_slice(qkv_ptr + b * QKV, q_ptr + b * NH * D, cache, v_offset, block_row_ptr + b * table_stride,
                          kvh, split, tl.load(seq_len_ptr + b), tl.load(pos_ptr + b), tl.load(slot_ptr + b),
                          cos_ptr, sin_ptr, _layer_tensor(table_ptr, layer, N_Q, dtype),
                          _layer_tensor(table_ptr, layer, N_K, dtype), part, lse, scale, eps, NH, NKV, HALF, GROUP,
                          BLOCK_G, SPLITS, BLOCK_N, PAGE, QK_NORM, DOT_PRECISION, WIDE, ATTENTION_STAGES, 0, True,
                          dtype)
            tl.debug_barrier()  # every thread's stores of the slice before any thread reads them back (or releases)
            if SPLITS == 1:
                _combine_heads(part, lse, attn_ptr + b * NH * D, kvh * GROUP, GROUP, SPLITS, BLOCK_G, BLOCK_S, D, dtype)
            else:
                counter = attention_arrivals + b * NKV + kvh
                if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
                    _combine_heads(part, lse, attn_ptr + b * NH * D, kvh * GROUP, GROUP, SPLITS, BLOCK_G, BLOCK_S, D,
                                   dtype)
                    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, TIMED)
        # 3. o_proj: (column block, slice of K)
        w_o = _layer_tensor(table_ptr, layer, W_O, dtype)
        for u in range(pid, CB * SPLIT_O, G):
            c, s = u % CB, u // CB
            acc = _product(attn_ptr, NH * D, w_o, c * BN, H, s * KS_O, tl.minimum(s * KS_O + KS_O, NH * D), ROWS, BM,
                           BN, KC, DOT_PRECISION)
            _finish_block(acc, h_ptr, ss_o, po_ptr, o_arrivals, c, s, ROWS, SPLIT_O, BM, BN, H, dtype)
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, TIMED)
        # 4. RMSNorm, gate_up_proj and SiLU-and-mul
        inv = _inv_rms(ss_o, eps, BM, CB, BCB, H)
        w_gate = _layer_tensor(table_ptr, layer, W_GATE_UP, dtype)
        norm = _layer_tensor(table_ptr, layer, N_POST, dtype)
        for u in range(pid, (I + GU - 1) // GU, G):
            gate, up = _normed_product(h_ptr, inv, norm, w_gate, u * GU, I, ROWS, BM, GU, H, KC, True, DOT_PRECISION,
                                       dtype)
            gate = gate.to(dtype).to(tl.float32)
            silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
            cols = u * GU + tl.arange(0, GU)
            tl.store(act_ptr + r[:, None] * I + cols[None, :], (silu * up.to(dtype).to(tl.float32)).to(dtype),
                     mask=rows & (cols < I)[None, :])
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, TIMED)
        # 5. down_proj: (column block, slice of K)
        w_down = _layer_tensor(table_ptr, layer, W_DOWN, dtype)
        for u in range(pid, CB * SPLIT_D, G):
            c, s = u % CB, u // CB
            acc = _product(act_ptr, I, w_down, c * BN, H, s * KS_D, tl.minimum(s * KS_D + KS_D, I), ROWS, BM, BN, KC,
                           DOT_PRECISION)
            _finish_block(acc, h_ptr, ss_d, pd_ptr, down_arrivals, c, s, ROWS, SPLIT_D, BM, BN, H, dtype)
        sync = _stage_end(counter_ptr, err_ptr, times_ptr, sync, pid, G, TIMED)
    # the final norm, a column block a unit
    inv = _inv_rms(ss_d, eps, BM, CB, BCB, H)
    for c in range(pid, CB, G):
        cols = c * BN + tl.arange(0, BN)
        tl.store(out_ptr + r[:, None] * H + cols[None, :], _normed(h_ptr, inv, final_norm_ptr, cols, ROWS, BM, H, dtype),
                 mask=rows)
    # The last program out resets the counters for the next launch: every program has passed its last barrier.
    if tl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")


def _power_of_2_from_16(n: int) -> bool:
    return n >= 16 and n & (n - 1) == 0


class PersistentBatchDecode(PersistentPass):
    """The one-launch pass of ``rows`` sequences (up to ``MAX_BATCH_ROWS``), its products as ``tl.dot`` over rows
    padded to ``BM`` (the next power of 2, at least 16). Launch settings left unset take ``BATCH_CONFIG``'s (a count
    of 0 is the launch's own choice, as there): ``block_n``, ``gate_up_cols``, ``k_chunk`` (powers of 2 from 16),
    ``o_slices`` and ``down_slices`` (slices of K), ``splits`` (of the context a (row, kv head)),
    ``attention_stages``; and ``num_programs``, ``num_warps``, ``num_stages`` and ``timed`` as
    ``PersistentDecode``'s."""

    kernel = _persistent_batch_kernel
    stages_before_layers = 1  # the embeddings'

    def __init__(self, model, kv_caches: list[torch.Tensor], rows: int, num_programs: int | None = None,
                 block_n: int | None = None, gate_up_cols: int | None = None, k_chunk: int | None = None,
                 o_slices: int | None = None, down_slices: int | None = None, splits: int | None = None,
                 attention_stages: int | None = None, num_warps: int = 4, num_stages: int = 3,
                 timed: bool = False) -> None:
        super().__init__(model, kv_caches, rows, MAX_BATCH_ROWS)
        given = dict(block_n=block_n, gate_up_cols=gate_up_cols, k_chunk=k_chunk, o_slices=o_slices,
                     down_slices=down_slices, splits=splits, attention_stages=attention_stages)
        self.settings = {key: BATCH_CONFIG[key] if value is None else value for key, value in given.items()}
        for name in ("block_n", "gate_up_cols", "k_chunk"):
            if not _power_of_2_from_16(self.settings[name]):
                raise ValueError(f"persistent decode: {name} must be a power of 2 from 16 (a tl.dot side), got "
                                 f"{self.settings[name]}")
        if self.hidden < 16:
            raise ValueError(f"persistent decode: a batched pass needs hidden_size from 16, got {self.hidden}")
        device = kv_caches[0].device
        self.bm = max(16, triton.next_power_of_2(rows))
        self.bn = min(self.settings["block_n"], self.hidden)
        self.kc = min(self.settings["k_chunk"], self.hidden)
        self.column_blocks = self.hidden // self.bn
        self.launch = dict(num_warps=num_warps, num_stages=num_stages)
        qkv_width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.h = torch.zeros(self.bm, self.hidden, dtype=self.dtype, device=device)
        self.ss = torch.zeros(2, self.column_blocks, self.bm, dtype=torch.float32, device=device)
        self.qkv = torch.empty(self.bm, qkv_width, dtype=self.dtype, device=device)
        self.q = torch.empty(self.bm, self.heads, self.head_dim, dtype=self.dtype, device=device)
        self.attn = torch.empty(self.bm, self.heads * self.head_dim, dtype=self.dtype, device=device)
        self.act = torch.empty(self.bm, self.inter, dtype=self.dtype, device=device)
        self.out = torch.empty(rows, self.hidden, dtype=self.dtype, device=device)
        # arrival counters: a (row, kv head)'s slices of the context, o_proj's and down_proj's column blocks
        self.arrivals = torch.zeros(self.bm * self.kv_heads + 2 * self.column_blocks, dtype=torch.int32, device=device)
        self.constexprs = dict(self.model_constexprs, BM=self.bm, BN=self.bn, GU=self.settings["gate_up_cols"],
                               KC=self.kc, BLOCK_N=PERSISTENT_CONFIG["block_n"], ATTENTION_STAGES=self.settings["attention_stages"] or None,
                               TIMED=timed)
        self._fit_grid(num_programs, self._configure)

    def _slices(self, k: int, count: int, programs: int) -> tuple[int, int]:
        """K of ``k`` in ``count`` slices (0: as many as give the column blocks about one unit a program), each a
        multiple of ``k_chunk``: (slices, width)."""
        count = count or max(1, programs // self.column_blocks)
        width = -(-k // (count * self.kc)) * self.kc
        return -(-k // width), width

    def _configure(self, num_programs: int) -> None:
        """The grid, the slices of the context and of o_proj's and down_proj's K for it, and their scratch."""
        self.num_programs = num_programs
        device = self.table.device
        self.splits = self.settings["splits"] or max(
            1, 1 << (max(1, num_programs // (self.kv_heads * self.rows)).bit_length() - 1))
        split_o, ks_o = self._slices(self.heads * self.head_dim, self.settings["o_slices"], num_programs)
        split_d, ks_d = self._slices(self.inter, self.settings["down_slices"], num_programs)
        self.part = torch.empty(self.bm * self.heads * self.splits, self.head_dim, dtype=torch.float32, device=device)
        self.lse = torch.empty(self.bm * self.heads * self.splits, dtype=torch.float32, device=device)
        self.po = torch.empty(split_o, self.bm, self.hidden, dtype=torch.float32, device=device)
        self.pd = torch.empty(split_d, self.bm, self.hidden, dtype=torch.float32, device=device)
        self.constexprs.update(SPLITS=self.splits, BLOCK_S=triton.next_power_of_2(self.splits), SPLIT_O=split_o,
                               KS_O=ks_o, SPLIT_D=split_d, KS_D=ks_d)

    def _arguments(self, input_ids, positions, slot_mapping, block_tables, seq_lens) -> tuple:
        return (self.table, self.embed, self.final_norm, self.cos, self.sin, input_ids, positions, slot_mapping,
                block_tables, seq_lens, self.h, self.ss, self.qkv, self.q, self.part, self.lse, self.attn, self.po,
                self.act, self.pd, self.arrivals, self.out, self.counters, self.error, self.times, self.rows,
                self.table.shape[0], self.v_offset, self.scale, self.eps, block_tables.stride(0))
