"""All-reduce kernels over peer-visible buffers: one-shot and two-shot, synchronised by flags in the buffers.

Every rank of the group owns one buffer that all its peers can address (CUDA IPC / symmetric memory between
the GPUs of one NVLink node; shared memory between processes on a host). ``buffer_ptrs[r]`` is rank r's buffer
as seen from this process. A buffer is laid out as:

    int64 flags[MAX_BLOCKS][WORLD]      flags[b][p]: the last barrier that block b of rank p reached (p writes it)
    int64 counters[MAX_BLOCKS][2]       this rank's block b: calls made, barriers passed (only b touches them)
    data[2][HALF_BYTES]                 two halves, used alternately by successive calls

The partition of a message among blocks depends only on its length and the (fixed) grid, so block b of every
rank touches the same elements. Barriers are therefore per block: block b of rank r waits only for block b of
its peers. That needs no grid-wide synchronisation, and it lets the kernel run under Triton's interpreter,
which executes one program after another.

Why alternate halves: call k+1 may copy its input in while a slower peer still reads call k's data. It can
only start call k+1's barrier once every peer has started call k, so the half call k-1 used is free. Why
barrier numbers only grow, and waits are ``>=``: a peer may pass a barrier and post the next one before this
rank has seen the first. Counters live in device memory, so captured CUDA graphs replay correctly.

Both kernels sum the ranks in rank order in float32 and round once, so every rank gets bitwise the same
result (``all_reduce_ref``).
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

# Triton's interpreter truncates float32 to bfloat16 where a GPU rounds to nearest even; it rounds first there.
ROUND_BEFORE_BF16_CAST = os.environ.get("TRITON_INTERPRET") == "1"

# The most programs a call may use. A communicator fixes its grid for life: the partition of a message among
# blocks must not change between calls.
MAX_BLOCKS = 64
MAX_PEERS = 8  # ranks of one NVLink node


def header_bytes(world: int) -> int:
    """Bytes before the data halves (flags and counters), rounded up to 256."""
    return (MAX_BLOCKS * world * 8 + MAX_BLOCKS * 2 * 8 + 255) // 256 * 256


@triton.jit
def _peer_data(buffer_ptrs, rank, HEADER: tl.constexpr, DTYPE: tl.constexpr):
    return (tl.load(buffer_ptrs + rank) + HEADER).to(tl.pointer_type(DTYPE))


@triton.jit
def _call_state(buffer_ptrs, block, half_elems, RANK, WORLD: tl.constexpr, FLAG_ROWS: tl.constexpr):
    """This rank's flags, this block's counters and what they say: calls and barriers so far, and which half
    of the data (an element offset) this call uses."""
    my_flags = tl.load(buffer_ptrs + RANK).to(tl.pointer_type(tl.int64))
    counters = my_flags + FLAG_ROWS * WORLD + block * 2
    calls = tl.load(counters)
    barriers = tl.load(counters + 1)
    return my_flags, counters, calls, barriers, (calls % 2) * half_elems


@triton.jit
def _round(acc, dtype, ROUND_BF16: tl.constexpr):
    """``acc`` (float32) in ``dtype``, rounded to nearest even."""
    if ROUND_BF16 and dtype == tl.bfloat16:
        bits = acc.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        acc = bits.to(tl.float32, bitcast=True)
    return acc.to(dtype)


@triton.jit
def _barrier(buffer_ptrs, my_flags, block, target, RANK, WORLD: tl.constexpr):
    """Post ``target`` in every peer's flags[block][RANK], then wait until every peer has posted at least it.
    Scalar atomics only: one thread a CTA performs each, as in a spin lock."""
    tl.debug_barrier()  # this program's earlier stores come before the release below (cumulativity)
    for p in tl.static_range(WORLD):
        pad = tl.load(buffer_ptrs + p).to(tl.pointer_type(tl.int64))
        tl.atomic_xchg(pad + block * WORLD + RANK, target, sem="release", scope="sys")
    for p in tl.static_range(WORLD):
        while tl.atomic_add(my_flags + block * WORLD + p, 0, sem="acquire", scope="sys") < target:
            pass
    tl.debug_barrier()  # the acquires come before every thread's loads that follow


# One compiled kernel a dtype and world, whatever the message's length or the rank: a new specialisation would
# load a module while the peers' kernels spin, and loading can wait for the device to go idle (a deadlock when
# the ranks share a process, as in tests/test_gpu_all_reduce.py).
NOT_SPECIALIZED = ["n", "half_elems", "RANK"]


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def one_shot_all_reduce_kernel(inp, out, n, buffer_ptrs, half_elems, HEADER: tl.constexpr, RANK,
                               WORLD: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                               BLOCK: tl.constexpr, FLAG_ROWS: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Each rank copies its input into its buffer, then reads every peer's and sums them in rank order."""
    block = tl.program_id(0)
    dtype = inp.dtype.element_ty
    my_flags, counters, calls, barriers, half = _call_state(buffer_ptrs, block, half_elems, RANK, WORLD, FLAG_ROWS)
    mine = _peer_data(buffer_ptrs, RANK, HEADER, dtype) + half
    for start in range(block * BLOCK, n, NUM_BLOCKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(mine + offs, tl.load(inp + offs, mask=m), mask=m)
    _barrier(buffer_ptrs, my_flags, block, barriers + 1, RANK, WORLD)
    for start in range(block * BLOCK, n, NUM_BLOCKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for r in tl.static_range(WORLD):
            acc += tl.load(_peer_data(buffer_ptrs, r, HEADER, dtype) + half + offs, mask=m).to(tl.float32)
        tl.store(out + offs, _round(acc, dtype, ROUND_BF16), mask=m)
    tl.store(counters, calls + 1)
    tl.store(counters + 1, barriers + 1)


@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def two_shot_all_reduce_kernel(inp, out, n, buffer_ptrs, half_elems, HEADER: tl.constexpr, RANK,
                               WORLD: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                               BLOCK: tl.constexpr, FLAG_ROWS: tl.constexpr, ROUND_BF16: tl.constexpr):
    """Reduce-scatter, then all-gather: rank r sums slice r of every peer's copy into its own buffer, in place
    (only rank r reads slice r in the first phase), then every rank reads each slice from its owner."""
    block = tl.program_id(0)
    dtype = inp.dtype.element_ty
    my_flags, counters, calls, barriers, half = _call_state(buffer_ptrs, block, half_elems, RANK, WORLD, FLAG_ROWS)
    mine = _peer_data(buffer_ptrs, RANK, HEADER, dtype) + half
    part = tl.cdiv(n, WORLD)
    for start in range(block * BLOCK, part, NUM_BLOCKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        for s in tl.static_range(WORLD):
            idx = s * part + offs
            m = (offs < part) & (idx < n)
            tl.store(mine + idx, tl.load(inp + idx, mask=m), mask=m)
    _barrier(buffer_ptrs, my_flags, block, barriers + 1, RANK, WORLD)
    for start in range(block * BLOCK, part, NUM_BLOCKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        idx = RANK * part + offs
        m = (offs < part) & (idx < n)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for r in tl.static_range(WORLD):
            acc += tl.load(_peer_data(buffer_ptrs, r, HEADER, dtype) + half + idx, mask=m).to(tl.float32)
        tl.store(mine + idx, _round(acc, dtype, ROUND_BF16), mask=m)
    _barrier(buffer_ptrs, my_flags, block, barriers + 2, RANK, WORLD)
    for start in range(block * BLOCK, part, NUM_BLOCKS * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        for s in tl.static_range(WORLD):
            idx = s * part + offs
            m = (offs < part) & (idx < n)
            tl.store(out + idx, tl.load(_peer_data(buffer_ptrs, s, HEADER, dtype) + half + idx, mask=m), mask=m)
    tl.store(counters, calls + 1)
    tl.store(counters + 1, barriers + 2)


def launch_all_reduce(two_shot: bool, inp, out, buffer_ptrs, half_elems: int, header: int, rank: int, world: int,
                      num_blocks: int, block: int = 1024, compile_only: bool = False) -> None:
    """Sum ``inp`` over the group into ``out`` (both contiguous, same dtype; ``inp.numel() <= half_elems``).
    ``compile_only``: compile and load the kernel, run nothing (an empty grid)."""
    kernel = two_shot_all_reduce_kernel if two_shot else one_shot_all_reduce_kernel
    kernel[(0 if compile_only else num_blocks,)](inp, out, inp.numel(), buffer_ptrs, half_elems, header, rank, world, num_blocks, block, MAX_BLOCKS, ROUND_BEFORE_BF16_CAST, num_warps=4)
