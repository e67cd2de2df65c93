"""The persistent decode chain with each stage's weights streamed into shared memory two stages ahead (Gluon, Hopper):
does DRAM then stay busy through the grid barriers? A feasibility measurement for #21's next design.

``persistent_decode_chain.py`` measured Qwen3-0.6B's layer without attention as one persistent launch: 17.93 us a
layer on an H200 with the sums in a fixed order (17.4 to 18.5 with atomic sums), each program reading its next
stage's tile into registers between a barrier's arrival and its wait. A layer's weights take 7.2 us at the H200's
copy rate (about 10 at the H100's), its four barriers about 4 us. In the engine's one-launch pass DRAM is busy about
40% of a layer, because each program can hold only one tile in flight, in registers (benchmarks/README.md,
thirty-eighth session). Triton cannot hold a tile in shared memory across a barrier; Gluon can.
``gluon_stream_chain.py`` (56 qkv-shaped products) found its time in its product, which summed across the warps
twice a 256-column box; this chain is the whole layer, and its product sums within each warp only.

Here each program (one an SM) keeps two slots of shared memory: slot A for qkv_proj's and gate_up_proj's tiles (64
and 128 KB), slot B for o_proj's and down_proj's (32 and 64 KB). As soon as a stage's products have read their slot,
the program asks the copy engine (TMA) for the tile of the stage after next into it, so every tile has the next stage
and two barriers to arrive. A stage then multiplies its tile from shared memory by the activations, 256 columns at a
time. When the copy is asked for is ``--ask`` (``ASKS``): the first run found each barrier waiting for the copy
asked for just before it. Everything else is ``persistent_decode_chain.py``'s ``ordered`` chain (the same packed
weights, roundings and fixed-order partial sums), checked against the same float32 reference.

The chain, its reference and its Triton kernels are imported from ``persistent_decode_chain.py``. Gluon does not
run in Triton's interpreter: on a CPU the script only builds the kernel for sm_90a (``--build``), which is what CI's
test checks.

    python benchmarks/scripts/persistent_decode_chain_smem.py --output-json OUT.json [--timeline] [--ask ORDER ...]   # on a Hopper GPU
    python benchmarks/scripts/persistent_decode_chain_smem.py --build                    # anywhere
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from persistent_decode_chain import (BN, EPS, INTER, LAYERS, QKV, SPLIT_D, SPLIT_O, H, Persistent, Q,  # noqa: E402
                                     closing, engine_chain, make_weights, measured, pack, reference, rel_error)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

    # A bulk copy into shared memory: ``async_load`` from Triton 3.7, ``async_copy_global_to_shared`` before.
    _bulk_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier
except ImportError:  # a Triton without Gluon's Hopper operations
    gluon = None

CHUNK = 256  # columns of a tile a bulk copy brings (a copy's box is at most 256 elements a side)
UNITS = {"qkv": QKV // BN, "o": (H // BN) * SPLIT_O, "gu": INTER // BN, "d": (H // BN) * SPLIT_D}
ROWS = {"qkv": BN, "o": BN, "gu": 2 * BN, "d": BN}  # rows of a unit's tile (gate_up's: its gate rows, then its up rows)
MAX_SPINS = 1 << 18  # a barrier that waits longer sets the error flag instead of hanging the GPU
STAGES = ("qkv", "o", "gu", "d")
# Where a timed launch (``--timeline``) records each program's time in each stage of each layer: the stage begun (the
# barrier before it passed), its tile there (the mbarrier passed), its product stored, and the barrier after it passed.
# A program without a unit in a stage records only the first and the last.
POINTS = ("begin", "ready", "done", "passed")
# When a program asks for the tile of the stage after next (``ASK``, a kernel constant): at the stage's end before its
# arrival at the barrier ("end"), after its arrival ("arrive_first"), or in the next stage once its vector is ready
# ("after_prep"). The forty-third session's timeline on an H100 found each barrier, from the last product to the median
# pass, about as long as the copy asked for just before it (5.2 us after gate_up's 12 MB, 1.7 after o_proj's 4 MB):
# the barrier waited for the copies, and the products waited for the barrier.
ASKS = ("end", "arrive_first", "after_prep")


if gluon is not None:

    @gluon.jit
    def _arrive(counter_ptr):
        """This program's stores so far made visible, then counted at the barrier."""
        _barrier()
        gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")

    @gluon.jit
    def _wait(counter_ptr, err_ptr, target, SPINS: gl.constexpr):
        """Until ``target`` arrivals (counted from the launch's start) have been made, or the error flag."""
        seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins = 0
        while (seen < target) & (spins < SPINS):
            seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            spins += 1
        if spins >= SPINS:
            gl.store(err_ptr, 1)
        _barrier()

    @gluon.jit
    def _ask(desc, unit_row, slot, bar, KCH: gl.constexpr, pred):
        """A unit's tile ([rows, KCH x 256] from row ``unit_row`` of the packed weights) into ``slot``, one bulk copy
        a 256-column chunk, all counted on ``bar``."""
        R: gl.constexpr = desc.block_type.shape[0]
        mbarrier.expect(bar, KCH * desc.block_type.nbytes, pred=pred)
        for c in gl.static_range(KCH):
            _bulk_load(desc, [unit_row, c * 256], bar, slot.index(c).slice(0, R, dim=0), pred=pred)

    @gluon.jit
    def _now(times_ptr, layer, stage: gl.constexpr, pid, G, point: gl.constexpr, TIMED: gl.constexpr):
        """With ``TIMED``: the global timer (ns) at ``point`` (``POINTS``) of ``stage`` of ``layer``, every warp of
        the program there first."""
        if TIMED:
            _barrier()
            t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            gl.store(times_ptr + ((layer * 4 + stage) * G + pid) * 4 + point, t)

    @gluon.jit
    def _free():
        """Every thread has read its slot (and the vector buffer): the copy engine may overwrite them."""
        _barrier()
        fence_async_shared()

    @gluon.jit
    def _hand_over(desc, unit_row, slot, bar, KCH: gl.constexpr, pred, counter_ptr, err_ptr, sync, G, SPINS: gl.constexpr,
                   times_ptr, layer, stage: gl.constexpr, pid, TIMED: gl.constexpr, ASK: gl.constexpr):
        """A stage's end: once every thread has read the slot, the tile of the stage after next asked for into it
        (``_ask``) before this program's arrival at the grid barrier (``ASK`` 0) or after it (1), and the barrier
        passed; with ``ASK`` 2 the next stage asks for it once its vector is ready. Returns the barriers passed so far."""
        _free()
        if ASK == 0:
            _ask(desc, unit_row, slot, bar, KCH, pred)
        _arrive(counter_ptr)
        if ASK == 1:
            _ask(desc, unit_row, slot, bar, KCH, pred)
        _wait(counter_ptr, err_ptr, (sync + 1) * G, SPINS)
        _now(times_ptr, layer, stage, pid, G, 3, TIMED)
        return sync + 1

    @gluon.jit
    def _split_product(x_smem, p_ptr, slot, bar, phase, pid, rows, times_ptr, layer, stage: gl.constexpr, G,
                       K: gl.constexpr, H: gl.constexpr, BN: gl.constexpr, L: gl.constexpr, TIMED: gl.constexpr):
        """o_proj's or down_proj's unit ``pid`` (column block ``pid % (H / BN)``, slice ``pid // (H / BN)`` of K): its
        slice of the activations (in ``x_smem``: ``_split_slice``) times its tile, stored as the slice's partial sums
        into ``p``."""
        s = pid // (H // BN)
        mbarrier.wait(bar, phase)
        _now(times_ptr, layer, stage, pid, G, 1, TIMED)
        y = _product(slot, x_smem, 0, BN, K // 256, L)
        gl.store(p_ptr + s * H + (pid % (H // BN)) * BN + rows, y)
        _now(times_ptr, layer, stage, pid, G, 2, TIMED)

    @gluon.jit
    def _product(slot, x_smem, R0: gl.constexpr, RC: gl.constexpr, KCH: gl.constexpr, L: gl.constexpr):
        """Rows R0 to R0 + RC of the tile in ``slot`` times the vector in ``x_smem`` (float32, KCH x 256)."""
        acc = gl.zeros([RC, 256], gl.float32, L)
        for c in gl.static_range(KCH):
            w = slot.index(c).slice(R0, RC, dim=0).load(L).to(gl.float32)
            xc = x_smem.slice(c * 256, 256).load(gl.SliceLayout(0, L))
            acc += w * gl.expand_dims(xc, 0)
        return gl.sum(acc, axis=1)

    @gluon.jit
    def _residual(h, p_ptr, SPLITS: gl.constexpr, H: gl.constexpr, HL: gl.constexpr):
        """This program's copy of the residual stream plus the slices' partial sums, in a fixed order."""
        offs = gl.arange(0, H, layout=HL)
        for s in gl.static_range(SPLITS):
            h += gl.load(p_ptr + s * H + offs, cache_modifier=".cg")
        return h

    @gluon.jit
    def _normed_into(x_smem, h, w_ptr, eps, H: gl.constexpr, HL: gl.constexpr):
        """RMSNorm of ``h``, rounded to bf16 as the engine's norm writes it, into ``x_smem`` for the products."""
        w = gl.load(w_ptr + gl.arange(0, H, layout=HL)).to(gl.float32)
        x = (h * gl.rsqrt(gl.sum(h * h, axis=0) / H + eps) * w).to(gl.bfloat16).to(gl.float32)
        x_smem.store(x)
        _barrier()

    @gluon.jit
    def _split_slice(x_smem, a_ptr, pid, K: gl.constexpr, H: gl.constexpr, BN: gl.constexpr, HL: gl.constexpr):
        """The slice of the activations that o_proj's or down_proj's unit ``pid`` multiplies, into ``x_smem``."""
        _slice_into(x_smem, a_ptr + (pid // (H // BN)) * K, K, HL)

    @gluon.jit
    def _slice_into(x_smem, a_ptr, K: gl.constexpr, HL: gl.constexpr):
        """A slice of bf16 activations (other programs wrote them: from L2) into ``x_smem`` as float32."""
        a = gl.load(a_ptr + gl.arange(0, K, layout=HL), cache_modifier=".cg").to(gl.float32)
        x_smem.slice(0, K).store(a)
        _barrier()

    @gluon.jit
    def _chain_smem_kernel(h_ptr, po_ptr, pd_ptr, qkv_ptr, act_ptr, wqkv_desc, wo_desc, wgu_desc, wd_desc, n1_ptr,
                           n2_ptr, counter_ptr, err_ptr, times_ptr, LAYERS, eps, G, H: gl.constexpr, Q: gl.constexpr,
                           QKV: gl.constexpr, INTER: gl.constexpr, BN: gl.constexpr, SPLIT_O: gl.constexpr, SPLIT_D: gl.constexpr,
                           NUM_WARPS: gl.constexpr, SPINS: gl.constexpr, TIMED: gl.constexpr, ASK: gl.constexpr):
        """The ordered chain for ``LAYERS`` layers over ``G`` programs, all resident, each doing at most one unit a
        stage (``G`` >= every stage's units): program ``pid`` does unit ``pid``. ``h`` is the float32 residual
        stream at the launch; ``pd`` must be zero there. Program 0 stores the result into ``h``. ``TIMED``: each
        program records ``POINTS`` of each stage into ``times`` ([layers, 4 stages, G, 4] ns). ``ASK``: when a slot's next
        tile is asked for (``ASKS``)."""
        pid = gl.program_id(0)
        U1: gl.constexpr = QKV // BN
        U2: gl.constexpr = (H // BN) * SPLIT_O
        U3: gl.constexpr = INTER // BN
        U4: gl.constexpr = (H // BN) * SPLIT_D
        KO: gl.constexpr = Q // SPLIT_O
        KD: gl.constexpr = INTER // SPLIT_D
        C1: gl.constexpr = H // 256
        C2: gl.constexpr = KO // 256
        C4: gl.constexpr = KD // 256
        L: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NUM_WARPS, 1], [1, 0])
        HL: gl.constexpr = gl.BlockedLayout([4], [32], [NUM_WARPS], [0])
        rows_l: gl.constexpr = gl.SliceLayout(1, L)
        dtype: gl.constexpr = wqkv_desc.dtype

        slot_a = gl.allocate_shared_memory(dtype, [C1, 2 * BN, 256], wgu_desc.layout)  # qkv_proj, gate_up_proj
        slot_b = gl.allocate_shared_memory(dtype, [C4, BN, 256], wd_desc.layout)  # o_proj, down_proj
        x_smem = gl.allocate_shared_memory(gl.float32, [H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(4):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        bar_qkv = bars.index(0)
        bar_o = bars.index(1)
        bar_gu = bars.index(2)
        bar_d = bars.index(3)

        rows = gl.arange(0, BN, layout=rows_l)
        _ask(wqkv_desc, pid * BN, slot_a, bar_qkv, C1, pid < U1)
        _ask(wo_desc, pid * BN, slot_b, bar_o, C2, pid < U2)
        h = gl.load(h_ptr + gl.arange(0, H, layout=HL))
        sync = 0
        for layer in range(LAYERS):
            phase = layer & 1
            more = layer + 1 < LAYERS
            # 1. norm, qkv_proj; then gate_up_proj's tile into slot A
            _now(times_ptr, layer, 0, pid, G, 0, TIMED)
            h = _residual(h, pd_ptr, SPLIT_D, H, HL)
            _normed_into(x_smem, h, n1_ptr + layer * H, eps, H, HL)
            if ASK == 2:  # this layer's o_proj tile into slot B, which the last stage read
                _ask(wo_desc, (layer * U2 + pid) * BN, slot_b, bar_o, C2, (pid < U2) & (layer > 0))
            if pid < U1:
                mbarrier.wait(bar_qkv, phase)
                _now(times_ptr, layer, 0, pid, G, 1, TIMED)
                y = _product(slot_a, x_smem, 0, BN, C1, L)
                gl.store(qkv_ptr + pid * BN + rows, y.to(gl.bfloat16))
                _now(times_ptr, layer, 0, pid, G, 2, TIMED)
            sync = _hand_over(wgu_desc, (layer * U3 + pid) * (2 * BN), slot_a, bar_gu, C1, pid < U3, counter_ptr, err_ptr,
                              sync, G, SPINS, times_ptr, layer, 0, pid, TIMED, ASK)
            # 2. o_proj's partial sums (the query part of qkv stands in for attention's output); then down_proj's
            # tile into slot B
            _now(times_ptr, layer, 1, pid, G, 0, TIMED)
            if pid < U2:
                _split_slice(x_smem, qkv_ptr, pid, KO, H, BN, HL)
            if ASK == 2:
                _ask(wgu_desc, (layer * U3 + pid) * (2 * BN), slot_a, bar_gu, C1, pid < U3)
            if pid < U2:
                _split_product(x_smem, po_ptr, slot_b, bar_o, phase, pid, rows, times_ptr, layer, 1, G, KO, H, BN, L, TIMED)
            sync = _hand_over(wd_desc, (layer * U4 + pid) * BN, slot_b, bar_d, C4, pid < U4, counter_ptr, err_ptr, sync, G,
                              SPINS, times_ptr, layer, 1, pid, TIMED, ASK)
            # 3. norm, gate_up_proj, SiLU-and-mul; then the next layer's qkv_proj tile into slot A
            _now(times_ptr, layer, 2, pid, G, 0, TIMED)
            h = _residual(h, po_ptr, SPLIT_O, H, HL)
            _normed_into(x_smem, h, n2_ptr + layer * H, eps, H, HL)
            if ASK == 2:
                _ask(wd_desc, (layer * U4 + pid) * BN, slot_b, bar_d, C4, pid < U4)
            if pid < U3:
                mbarrier.wait(bar_gu, phase)
                _now(times_ptr, layer, 2, pid, G, 1, TIMED)
                g = _product(slot_a, x_smem, 0, BN, C1, L).to(gl.bfloat16).to(gl.float32)
                up = _product(slot_a, x_smem, BN, BN, C1, L).to(gl.bfloat16).to(gl.float32)
                gl.store(act_ptr + pid * BN + rows, (g / (1.0 + gl.exp(-g)) * up).to(gl.bfloat16))
                _now(times_ptr, layer, 2, pid, G, 2, TIMED)
            sync = _hand_over(wqkv_desc, ((layer + 1) * U1 + pid) * BN, slot_a, bar_qkv, C1, (pid < U1) & more, counter_ptr,
                              err_ptr, sync, G, SPINS, times_ptr, layer, 2, pid, TIMED, ASK)
            # 4. down_proj's partial sums; then the next layer's o_proj tile into slot B
            _now(times_ptr, layer, 3, pid, G, 0, TIMED)
            if pid < U4:
                _split_slice(x_smem, act_ptr, pid, KD, H, BN, HL)
            if ASK == 2:
                _ask(wqkv_desc, ((layer + 1) * U1 + pid) * BN, slot_a, bar_qkv, C1, (pid < U1) & more)
            if pid < U4:
                _split_product(x_smem, pd_ptr, slot_b, bar_d, phase, pid, rows, times_ptr, layer, 3, G, KD, H, BN, L, TIMED)
            sync = _hand_over(wo_desc, ((layer + 1) * U2 + pid) * BN, slot_b, bar_o, C2, (pid < U2) & more, counter_ptr,
                              err_ptr, sync, G, SPINS, times_ptr, layer, 3, pid, TIMED, ASK)
        for i in gl.static_range(4):
            mbarrier.invalidate(bars.index(i))
        if pid == 0:
            gl.store(h_ptr + gl.arange(0, H, layout=HL), _residual(h, pd_ptr, SPLIT_D, H, HL))


def available() -> bool:
    return gluon is not None


def _layout():
    """Unswizzled: a warp reads a tile's row of 256 columns (512 bytes) from shared memory, 16 bytes a thread."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


def descriptors(packed: dict) -> dict:
    """A bulk-copy descriptor of each stage's packed weights ([layers, units, rows, K] as [layers x units x rows, K]),
    a box of one unit's rows by 256 columns."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    out = {}
    for name, key in (("qkv", "wqkv"), ("o", "wo"), ("gu", "wgu"), ("d", "wd")):
        w = packed[key]
        flat = w.reshape(-1, w.shape[-1])
        out[name] = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [ROWS[name], CHUNK], _layout())
    return out


class PersistentSmem(Persistent):
    """Buffers and one launch of the shared-memory chain (always the ordered sums)."""

    def __init__(self, packed: dict, grid: int, num_warps: int, layers: int = LAYERS, timed: bool = False,
                 ask: str = "end"):
        """``timed``: each launch records ``POINTS`` into ``times`` ([layers, 4 stages, grid, 4] ns; ``timeline``);
        ``ask``: one of ``ASKS``."""
        if grid < max(UNITS.values()):
            raise ValueError(f"the shared-memory chain needs a program for every unit of a stage (grid {grid})")
        super().__init__(packed, grid, "none", num_warps, layers=layers, deterministic=True)
        self.descs = descriptors(packed)
        self.timed = timed
        self.ask = ASKS.index(ask)
        self.times = torch.zeros((layers, 4, grid, len(POINTS)) if timed else 1, dtype=torch.int64, device=self.h.device)

    def __call__(self) -> torch.Tensor:
        w, d = self.packed, self.descs
        self.h.copy_(w["h0"])
        self.counter.zero_()
        self.pd.zero_()
        _chain_smem_kernel[(self.grid,)](
            self.h, self.po, self.pd, self.qkv, self.act, d["qkv"], d["o"], d["gu"], d["d"], w["n1"], w["n2"],
            self.counter, self.err, self.times, self.layers, EPS, self.grid, H=H, Q=Q, QKV=QKV, INTER=INTER, BN=BN,
            SPLIT_O=SPLIT_O, SPLIT_D=SPLIT_D, NUM_WARPS=self.num_warps, SPINS=MAX_SPINS, TIMED=self.timed,
            ASK=self.ask, num_warps=self.num_warps)
        return self.h


def timeline(times: torch.Tensor) -> dict:
    """A timed launch's ``[layers, 4 stages, programs, POINTS]`` ns as us a stage, means over the layers but the
    first and the last. Over the programs with a unit: the median wait for the tile once the stage began
    (``tile_wait``: the vector's preparation included), the median product (``product``), the last product done after
    the median one (``last_done``), and the barrier from that last product to the median program's pass
    (``barrier``); over every program, the stage from the median begin to the median pass (``stage``)."""
    t = times.double() / 1e3
    inner = slice(1, t.shape[0] - 1) if t.shape[0] > 2 else slice(None)

    def mean(x: torch.Tensor) -> float:  # x: a value a layer
        return round(x[inner].mean().item(), 3)

    def med(x: torch.Tensor) -> torch.Tensor:  # over the programs
        return x.median(1).values

    out: dict = {}
    for index, name in enumerate(STAGES):
        begin, ready, done, passed = (t[:, index, :, point] for point in range(len(POINTS)))
        u = UNITS[name]
        last = done[:, :u].max(1).values
        out[name] = dict(tile_wait=mean(med(ready[:, :u] - begin[:, :u])), product=mean(med(done[:, :u] - ready[:, :u])),
                         last_done=mean(last - med(done[:, :u])), barrier=mean(med(passed) - last),
                         stage=mean(med(passed) - med(begin)))
    out["layer"] = round(sum(out[name]["stage"] for name in STAGES), 3)
    return out


def build(num_warps: int = 4, timed: bool = False, ask: str = "end") -> dict:
    """The kernel compiled for sm_90a by this process's Triton, through ptxas (no GPU needed): registers, spills,
    shared memory."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from tests.kernel_builds import cubin_resources

    constexprs = dict(H=H, Q=Q, QKV=QKV, INTER=INTER, BN=BN, SPLIT_O=SPLIT_O, SPLIT_D=SPLIT_D, NUM_WARPS=num_warps,
                      SPINS=MAX_SPINS, TIMED=timed, ASK=ASKS.index(ask))
    descs = {"wqkv_desc": "qkv", "wo_desc": "o", "wgu_desc": "gu", "wd_desc": "d"}
    signature = {}
    for param in _chain_smem_kernel.params:
        name = param.name
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in descs:
            signature[name] = f"tensordesc<bf16[{ROWS[descs[name]]}, {CHUNK}],{_layout()}>"
        elif name in ("LAYERS", "G"):
            signature[name] = "i32"
        elif name == "eps":
            signature[name] = "fp32"
        elif name in ("qkv_ptr", "act_ptr", "n1_ptr", "n2_ptr"):
            signature[name] = "*bf16"
        elif name in ("counter_ptr", "err_ptr"):
            signature[name] = "*i32"
        elif name == "times_ptr":
            signature[name] = "*i64"
        else:
            signature[name] = "*fp32"
    source = GluonASTSource(_chain_smem_kernel, signature, constexprs)
    return cubin_resources(source, GPUTarget("cuda", 90, 32), {"num_warps": num_warps})


def way_name(num_warps: int, ask: str) -> str:
    """A shared-memory way's key in the results: ``smem_w8``, ``smem_w8_after_prep``."""
    return f"smem_w{num_warps}" + ("" if ask == "end" else f"_{ask}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--num-warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--build", action="store_true", help="only build the kernel for sm_90a and print its resources")
    parser.add_argument("--ask", nargs="+", choices=ASKS, default=list(ASKS),
                        help="when a program asks for a slot's next tile (``ASKS``)")
    parser.add_argument("--timeline", action="store_true",
                        help="also time each shared-memory way's programs stage by stage in one launch (``timeline``)")
    args = parser.parse_args()
    if not available():
        sys.exit("this Triton has no Gluon Hopper operations")
    ways = {way_name(n, ask): (n, ask) for n in args.num_warps for ask in args.ask}
    if args.build or not torch.cuda.is_available():
        print(json.dumps({f"{name}{'_timed' if timed else ''}": build(n, timed, ask) for name, (n, ask) in ways.items()
                          for timed in ((False, True) if args.timeline else (False,))}))
        return
    from raygrid.bench.kernel_timing import chain_us
    from raygrid.bench.throughput import provenance

    device = "cuda"
    w = make_weights(device)
    cpu = {k: v.cpu() for k, v in w.items()}
    want, want_one = reference(cpu).to(device), reference(cpu, 1).to(device)
    packed = pack(w)
    grid = torch.cuda.get_device_properties(0).multi_processor_count
    results: dict = {"layers": LAYERS, **provenance(), "grid": grid}
    engine = engine_chain(w)
    results["engine"] = {"us_per_layer": chain_us([engine], replays=50) / LAYERS}
    print("engine", results["engine"], flush=True)
    runners = {"registers_w8_ordered": lambda layers=LAYERS: Persistent(packed, grid, "registers", 8, layers=layers,
                                                                         deterministic=True)}
    for name, (n, ask) in ways.items():
        runners[name] = lambda layers=LAYERS, n=n, ask=ask: PersistentSmem(packed, grid, n, layers=layers, ask=ask)
    for name, make in runners.items():
        results[name] = measured(make(), make(1), want, want_one)
        print(name, results[name], flush=True)
    if args.timeline:
        for name, (n, ask) in ways.items():
            timed = PersistentSmem(packed, grid, n, timed=True, ask=ask)
            got = timed().clone()
            torch.cuda.synchronize()
            results[name]["timeline"] = dict(timeline(timed.times.cpu()), rel_error=rel_error(got, want),
                                             barrier_timed_out=bool(timed.err.item()))
            print(f"{name} timeline", results[name]["timeline"], flush=True)
    closing(results, engine, args.output_json)


if __name__ == "__main__":
    os.environ.setdefault("RAYGRID_PDL", "1")
    main()
