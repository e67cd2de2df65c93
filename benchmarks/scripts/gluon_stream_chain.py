"""Can a persistent launch keep DRAM streaming through its grid barriers if its weights wait in shared memory?

The one-launch decode pass (``kernels/persistent_decode.py``) can have one weight tile a program in flight, in
registers, and only from a barrier's arrival; at 512 tokens its layers keep DRAM busy about 40% of the time
(benchmarks/README.md, thirty-eighth session). In Gluon a program can ask for its weights by bulk copies (TMA) into
shared memory any number of stages ahead, and wait for them on an mbarrier only when it needs them. The open question
is the one the tenth and twenty-fourth sessions' L2 requests raised: do bytes in flight lengthen the barriers as much
as they save? This chain answers it without the pass's other work:

    y_l = W_l x_l  (W_l: R x K, bf16; one unit of BN rows a program), its R / K slices of K summed into a_l by
          atomic adds;  grid barrier;
    x_{l+1} = RMS-normalized a_l  (K floats, read from L2 by every program, as the pass reads its hidden state)

over ``--layers`` different weights (each read from DRAM), five ways (``MODE``):
- ``none``: each program reads its tile after the barrier (plain loads);
- ``registers``: between its arrival and its wait (the one-launch pass's read-ahead);
- ``smem``: by bulk copies into a ring of ``--slots`` tiles of shared memory, asked for as soon as a slot is free,
  so each layer's tile was asked for ``slots`` layers ahead;
  with 1 slot, the next layer's unit is asked for as soon as this one's is in registers, before the arrival;
- ``smem_after_arrival``: the same ring, each slot refilled only after the program's arrival (in case copies in
  flight hold up the arrival's release, as loads before it did in the eighth session);
- ``barrier_only``: no weights and no product, each program adding zeros: what a layer costs without its GEMV (the
  atomics, the barrier, the fold), unchecked (its result is zero).

On an H100 (thirty-ninth session) every way took about 12.2 us a layer at R = 4,096 (4.4x the floor) and 7.0 at
R = 2,048, the ring no faster than reading after the barrier, both with every program folding all of y_l after the
barrier (the first version) and with the slices summed by atomic adds before it (this one): neither the weights nor
the fold hold the chain. ``--timeline`` records each program's times in each layer to find what does.

Each is checked against a float32 torch reference of the same chain and timed as CUDA graph replays; the floor is the
weights at the card's copy rate. Needs a Hopper GPU and Triton's Gluon (3.6 on the device machine).

    python benchmarks/scripts/gluon_stream_chain.py OUT.json [--layers 56] [--rows 4096] [--k 1024] [--slots 1 2 3]
        [--timeline]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.memory_floor import copy_bandwidth
from raygrid.bench.throughput import provenance
from raygrid.kernels.gluon_attention import gluon

if gluon is not None:  # Gluon's Hopper operations, as the prompt kernel imports them
    from raygrid.kernels.gluon_attention import TensorDescriptor, _barrier, _bulk_load, gl, mbarrier

BN = 16  # rows a unit (a program)
BOX = 256  # a bulk copy's columns (a TMA box side is at most 256)
MODES = {"none": 0, "registers": 1, "smem": 2, "smem_after_arrival": 3, "barrier_only": 4}
# Where a timed launch (``--timeline``) records each program's time in each layer: its start, its product done, its
# arrival made, the barrier passed (the next layer's start ends the fold of a_l).
POINTS = ("start", "product", "arrived", "passed")

if gluon is not None:

    @gluon.jit
    def _box(w_ptr, row0, c, K: gl.constexpr, BOX: gl.constexpr, layout: gl.constexpr):
        """Columns ``c * BOX ..`` of a unit's ``BN`` rows, by plain loads."""
        rows = row0 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
        cols = c * BOX + gl.arange(0, BOX, layout=gl.SliceLayout(0, layout))
        return gl.load(w_ptr + gl.expand_dims(rows, 1) * K + gl.expand_dims(cols, 0))

    @gluon.jit
    def _unit(w_ptr, row0, K: gl.constexpr, BOX: gl.constexpr, layout: gl.constexpr):
        """A program's unit of one layer's weight by plain loads, as its four ``[BN, BOX]`` boxes."""
        return (_box(w_ptr, row0, 0, K, BOX, layout), _box(w_ptr, row0, 1, K, BOX, layout),
                _box(w_ptr, row0, 2, K, BOX, layout), _box(w_ptr, row0, 3, K, BOX, layout))

    @gluon.jit
    def _ask(w_desc, ring, slot, bar, layer, row0, R: gl.constexpr, BOX: gl.constexpr, pred):
        """Layer ``layer``'s unit into slot ``slot`` of the ring: four bulk copies of ``[BN, BOX]`` on one mbarrier."""
        mbarrier.expect(bar, w_desc.block_type.nbytes * 4, pred=pred)
        for c in gl.static_range(4):
            _bulk_load(w_desc, [layer * R + row0, c * BOX], bar, ring.index(slot * 4 + c), pred=pred)

    @gluon.jit
    def _part(w, x2d, c, layout: gl.constexpr):
        """One box's share of the unit's product: ``w`` ``[BN, BOX]`` times row ``c`` of ``x2d`` ``[4, BOX]``."""
        chunk = gl.arange(0, 4, layout=gl.SliceLayout(1, layout))
        xc = gl.sum(gl.where(gl.expand_dims(chunk == c, 1), x2d, 0.0), axis=0)
        return gl.sum(w.to(gl.float32) * gl.expand_dims(xc, 0), axis=1)

    @gluon.jit
    def _now(times_ptr, layer, pid, G, point: gl.constexpr, TIMED: gl.constexpr):
        """With ``TIMED``: the global timer (ns) at ``point`` of ``layer`` (``POINTS``), every warp of the program
        there first."""
        if TIMED:
            _barrier()
            t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            gl.store(times_ptr + (layer * G + pid) * 4 + point, t)

    @gluon.jit
    def _chain_kernel(w_ptr, w_desc, x0_ptr, acc_ptr, out_ptr, counter_ptr, times_ptr, LAYERS, eps,
                      R: gl.constexpr, K: gl.constexpr, BOX: gl.constexpr, MODE: gl.constexpr, SLOTS: gl.constexpr,
                      TIMED: gl.constexpr):
        """The chain over ``LAYERS`` weights, one ``[BN, K]`` unit a program (``K == 4 * BOX``), a grid barrier after
        each layer's product. ``MODE``: 0 the unit read after the barrier, 1 between arrival and wait (registers),
        2 by bulk copies into a ring of ``SLOTS`` units of shared memory, each asked for once its slot is free, 3 the
        same ring, each slot refilled only after the program's arrival, 4 no weights and no product (the rest of a
        layer alone). ``TIMED``: each program records when it
        reaches each of ``POINTS`` in each layer (``_now``)."""
        gl.static_assert(K == 4 * BOX)
        layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32], warps_per_cta=[4, 1],
                                                order=[1, 0])
        pid = gl.program_id(0)
        G = gl.num_programs(0)
        row0 = pid * 16
        rows = row0 + gl.arange(0, 16, layout=gl.SliceLayout(1, layout))
        x_offs = (gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(1, layout)), 1) * BOX
                  + gl.expand_dims(gl.arange(0, BOX, layout=gl.SliceLayout(0, layout)), 0))
        x2d = gl.load(x0_ptr + x_offs)
        ring = gl.allocate_shared_memory(w_desc.dtype, [SLOTS * 4, 16, BOX], w_desc.layout)  # 4 boxes a slot
        bars = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(SLOTS):
            mbarrier.init(bars.index(s), count=1)
        if MODE >= 2:
            for s in gl.static_range(SLOTS):
                _ask(w_desc, ring, s, bars.index(s), s, row0, R, BOX, s < LAYERS)
        n0, n1, n2, n3 = _unit(w_ptr, row0, K, BOX, layout)  # layer 0's unit (``registers``)
        for layer in range(LAYERS):
            _now(times_ptr, layer, pid, G, 0, TIMED)
            if MODE == 0:
                w0, w1, w2, w3 = _unit(w_ptr + layer * R * K, row0, K, BOX, layout)
            elif MODE == 1:
                w0, w1, w2, w3 = n0, n1, n2, n3
            elif MODE <= 3:
                slot = layer % SLOTS
                mbarrier.wait(bars.index(slot), (layer // SLOTS) & 1)
                w0, w1, w2, w3 = (ring.index(slot * 4).load(layout), ring.index(slot * 4 + 1).load(layout),
                                  ring.index(slot * 4 + 2).load(layout), ring.index(slot * 4 + 3).load(layout))
                _barrier()  # every warp has read the slot: it may be refilled
                if MODE == 2:
                    _ask(w_desc, ring, slot, bars.index(slot), layer + SLOTS, row0, R, BOX, layer + SLOTS < LAYERS)
            if MODE == 4:  # no weights and no product: the atomics, the barrier and the fold alone
                y = gl.zeros([16], gl.float32, gl.SliceLayout(1, layout))
            else:
                y = (_part(w0, x2d, 0, layout) + _part(w1, x2d, 1, layout) + _part(w2, x2d, 2, layout)
                     + _part(w3, x2d, 3, layout))
            _now(times_ptr, layer, pid, G, 1, TIMED)
            gl.atomic_add(acc_ptr + layer * K + rows % K, y, sem="relaxed", scope="gpu")  # a_l, zeroed by the host
            _barrier()
            gl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
            _now(times_ptr, layer, pid, G, 2, TIMED)
            if MODE == 3:  # refilled only once the arrival is made, as the registers' read-ahead
                _ask(w_desc, ring, slot, bars.index(slot), layer + SLOTS, row0, R, BOX, layer + SLOTS < LAYERS)
            if MODE == 1:
                n0, n1, n2, n3 = _unit(w_ptr + gl.minimum(layer + 1, LAYERS - 1) * R * K, row0, K, BOX, layout)
            target = (layer + 1) * G
            seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
            spins = 0
            while (seen < target) & (spins < 1 << 22):  # a few seconds: programs not all resident
                seen = gl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
                spins += 1
            if seen < target:
                gl.store(counter_ptr + 2, 1)
            _barrier()
            _now(times_ptr, layer, pid, G, 3, TIMED)
            fold = gl.load(acc_ptr + layer * K + x_offs, cache_modifier=".cg")
            x2d = fold * gl.rsqrt(gl.sum(gl.sum(fold * fold, axis=1), axis=0) / K + eps)
        for s in gl.static_range(SLOTS):
            mbarrier.invalidate(bars.index(s))
        if pid == 0:
            gl.store(out_ptr + x_offs, x2d)
        # the last program out resets the counter for the next launch
        if gl.atomic_add(counter_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
            gl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
            gl.atomic_xchg(counter_ptr + 1, 0, sem="relaxed", scope="gpu")


def reference(weights: torch.Tensor, x0: torch.Tensor, eps: float) -> torch.Tensor:
    """The chain in float32 over the bf16 weights ``[LAYERS, R, K]``."""
    x = x0.float()
    rows, k = weights.shape[1], weights.shape[2]
    for w in weights:
        y = w.float() @ x
        fold = y.view(rows // k, k).sum(0)
        x = fold * torch.rsqrt((fold * fold).mean() + eps)
    return x


def timeline(times: torch.Tensor) -> dict:
    """A timed launch's ``[layers, programs, POINTS]`` ns as us a layer (means over the layers but the first and
    last): the median program's product (from its start), arrival (the atomics and the release), wait and fold (the
    barrier passed to the next layer's start); the slowest program's product; the last arrival after the median one;
    the barrier (the median pass after the last arrival); and the layer (the median start to the next)."""
    t = times.double() / 1e3
    start, product, arrived, passed = (t[:, :, i] for i in range(4))
    inner = slice(1, t.shape[0] - 1)

    def mean(x: torch.Tensor) -> float:  # x: a value a layer (for a layer and the next, one fewer)
        return round(x[inner].mean().item(), 3)

    med = lambda x: x.median(1).values  # noqa: E731  (over the programs)
    return dict(product=mean(med(product - start)), product_max=mean((product - start).max(1).values),
                arrive=mean(med(arrived - product)), wait=mean(med(passed - arrived)),
                last_arrival=mean(arrived.max(1).values - med(arrived)),
                barrier=mean(med(passed) - arrived.max(1).values),
                fold=mean(med(start[1:] - passed[:-1])), layer=mean(med(start)[1:] - med(start)[:-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_json")
    parser.add_argument("--layers", type=int, default=56)
    parser.add_argument("--rows", type=int, default=4096, help="R: each weight's rows, BN a program (Qwen3-0.6B's qkv)")
    parser.add_argument("--k", type=int, default=1024, help="K: each weight's columns (4 x 256)")
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 3],
                        help="ring sizes (32 KB a slot; two programs an SM hold at most 3)")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--timeline", action="store_true",
                        help="also time each way's programs point by point in one launch (``timeline``)")
    args = parser.parse_args()
    if gluon is None:
        parser.error("needs Triton's Gluon with its Hopper operations")
    if args.k != 4 * BOX or args.rows % BN or args.rows % args.k:
        parser.error(f"--k must be {4 * BOX} and --rows a multiple of {BN} and of --k")
    device = torch.device("cuda")
    torch.manual_seed(0)
    programs = args.rows // BN
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if programs > 2 * sms:
        parser.error(f"--rows / {BN} = {programs} programs: more than two an SM ({2 * sms}) need not be resident")
    weights = (torch.randn(args.layers, args.rows, args.k, device=device) / math.sqrt(args.k)).to(torch.bfloat16)
    flat = weights.view(-1, args.k)
    desc = TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [BN, BOX],
                            gl.NVMMASharedLayout.get_default_for([BN, BOX], gl.bfloat16))
    x0 = torch.randn(args.k, device=device)
    eps = 1e-6
    expected = reference(weights, x0, eps)
    acc = torch.zeros(args.layers, args.k, device=device)  # a_l, zeroed before each launch
    counters = torch.zeros(3, dtype=torch.int32, device=device)  # arrivals, programs out, a barrier timed out
    times = torch.zeros(args.layers * programs * len(POINTS), dtype=torch.int64, device=device)  # ``--timeline``
    resident = -(-programs // sms)  # programs an SM
    shared = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
    floor_us = weights[0].numel() * 2 / copy_bandwidth(device) * 1e6
    results = []
    ways = [("barrier_only", 1), ("none", 1), ("registers", 1)] + [(way, s) for s in args.slots for way in ("smem", "smem_after_arrival")
                                               if (s * BN * args.k * 2 + 8192) * resident <= shared]
    for name, slots in ways + ways[::-1]:  # each way twice, the second round in reverse order
        out = torch.zeros(args.k, device=device)

        def run(timed: bool = False):
            acc.zero_()
            _chain_kernel[(programs,)](flat, desc, x0, acc, out, counters, times, args.layers, eps, R=args.rows,
                                       K=args.k, BOX=BOX, MODE=MODES[name], SLOTS=slots, TIMED=timed, num_warps=4)

        try:
            run()
            torch.cuda.synchronize()
            error = None if name == "barrier_only" else ((out - expected).norm() / expected.norm()).item()
            if counters[2].item():
                raise RuntimeError("a grid barrier timed out: the programs were not all resident")
            us = chain_us([run], args.replays) / args.layers
            results.append(dict(way=name, slots=slots, us_a_layer=us, over_floor=us / floor_us, rel_error=error))
            if args.timeline:
                run(timed=True)
                results[-1]["timeline"] = timeline(times.view(args.layers, programs, len(POINTS)).cpu())
        except Exception as failure:  # a way that does not compile or fit: recorded, the others still run
            results.append(dict(way=name, slots=slots, error=f"{type(failure).__name__}: {failure}"[:400]))
        print(json.dumps(results[-1]), flush=True)
    Path(args.output_json).write_text(json.dumps(dict(
        provenance(), torch=torch.__version__, triton=__import__("triton").__version__, layers=args.layers,
        rows=args.rows, k=args.k, programs=programs, floor_us_a_layer=floor_us, results=results), indent=1))


if __name__ == "__main__":
    main()
