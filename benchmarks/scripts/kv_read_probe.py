"""How fast programs shaped like a batch-1 decode's can read a layer's K/V cache, by layout and access shape, with
no attention arithmetic: each program sums the tiles it loads (so the loads stay) and writes one number.

The question: the one-launch pass's attention stage and the engine's split decode launch both read a 32k
context's cache at about 3.4 to 3.6 TB/s (134 MB a layer in 37 to 40 us), against about 4.3 for a copy. Is that the
cache's layout (each kv head's keys are 256 bytes every 2 KB of a page, [blocks, page, kv_heads, head_dim]), the
programs' bytes in flight, or the arithmetic between loads?

    python benchmarks/scripts/kv_read_probe.py OUT.json [--tokens 32768] [--layers 28] [--cases head rows hnd] [--quick]

Cases (the cache of ``--layers`` layers, each launch over one layer's K and V, the launches over every layer chained
in a CUDA graph, so that L2 holds none of a layer when it is read; ``kernel_timing.chain_us``):
- ``head``: a program per (kv head, slice) reads its head's [BLOCK_N, head_dim] tiles: the decode kernels' shape.
- ``rows``: a program per slice reads whole [BLOCK_N / kv_heads, kv_heads * head_dim] rows: the same bytes a tile,
  contiguous.
- ``hnd``: the cache laid out [blocks, kv_heads, page, head_dim], a program per (kv head, slice): each tile contiguous.
- ``tma``: ``head``'s tiles by bulk copies (tensor descriptors over [slots, kv_heads * head_dim] rows, as the engine's
  decode launch takes them; Hopper only), where the others gather rows with per-thread loads.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from raygrid.bench.kernel_timing import chain_us

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host-side descriptors
    TensorDescriptor = None

CASES = ("head", "rows", "hnd", "tma")


@triton.jit
def _read_kernel(k_ptr, v_ptr, out_ptr, tokens_per_prog, TOKEN_STRIDE: tl.constexpr,
                 HEAD_STRIDE: tl.constexpr, PAGE: tl.constexpr, PAGE_STRIDE: tl.constexpr, NKV: tl.constexpr,
                 BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, STAGES: tl.constexpr, HEAD_MAJOR: tl.constexpr):
    pid = tl.program_id(0)
    if HEAD_MAJOR:  # a program per (kv head, slice)
        head = pid % NKV
        part = pid // NKV
    else:
        head = 0
        part = pid
    lo = part * tokens_per_prog
    cols = tl.arange(0, WIDTH)
    acc = tl.zeros([BLOCK_N, WIDTH], dtype=tl.float32)
    for start in tl.range(lo, lo + tokens_per_prog, BLOCK_N, num_stages=STAGES):
        pos = start + tl.arange(0, BLOCK_N)
        off = (pos // PAGE) * PAGE_STRIDE + (pos % PAGE) * TOKEN_STRIDE + head * HEAD_STRIDE
        k = tl.load(k_ptr + off.to(tl.int64)[:, None] + cols[None, :])
        v = tl.load(v_ptr + off.to(tl.int64)[:, None] + cols[None, :])
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, 1), 0))


@triton.jit
def _read_tma_kernel(k_desc, v_desc, out_ptr, tokens_per_prog, NKV: tl.constexpr, BLOCK_N: tl.constexpr,
                     D: tl.constexpr, STAGES: tl.constexpr):
    """``_read_kernel``'s head case with each [BLOCK_N, D] tile of one kv head brought by one bulk copy."""
    pid = tl.program_id(0)
    head = pid % NKV
    lo = (pid // NKV) * tokens_per_prog
    acc = tl.zeros([BLOCK_N, D], dtype=tl.float32)
    for start in tl.range(lo, lo + tokens_per_prog, BLOCK_N, num_stages=STAGES):
        k = k_desc.load([start, head * D])
        v = v_desc.load([start, head * D])
        acc += k.to(tl.float32) + v.to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc, 1), 0))


def _tma_launch(cache, out, grid: int, per_prog: int, block_n: int, stages: int, args):
    """One layer's launch of the bulk-copy case over ``cache`` ([2, tokens * kv_heads * head_dim]: K, then V), with
    descriptors shaped as ``triton_attention._cache_descriptors`` shapes the engine's. Not that function itself: it
    refuses tiles longer than a page, which a cache with its pages in order, as here, can still take."""
    if TensorDescriptor is None:
        raise RuntimeError("this Triton has no host-side tensor descriptors")
    rows, width = args.tokens, args.kv_heads * args.head_dim
    k_desc, v_desc = (TensorDescriptor(half.view(rows, width), [rows, width], [width, 1], [block_n, args.head_dim])
                      for half in cache)
    return lambda: _read_tma_kernel[(grid,)](k_desc, v_desc, out, per_prog, NKV=args.kv_heads, BLOCK_N=block_n,
                                             D=args.head_dim, STAGES=stages, num_warps=4, num_stages=stages)


def run_case(case: str, units: int, block_n: int, stages: int, caches, out, args) -> dict:
    """One launch shape over every layer: microseconds a layer and the rate of the bytes its programs read."""
    nkv, d, page, tokens = args.kv_heads, args.head_dim, args.page, args.tokens
    row = dict(case=case, programs=units, block_n=block_n, stages=stages)
    if case == "rows":  # a program per slice, whole token rows (every head): the same bytes a tile as the others
        rows, width, heads = block_n // nkv, nkv * d, 1
        kw = dict(TOKEN_STRIDE=nkv * d, HEAD_STRIDE=0, BLOCK_N=rows, WIDTH=width, HEAD_MAJOR=False)
    else:
        rows, width, heads = block_n, d, nkv
        strides = dict(TOKEN_STRIDE=nkv * d, HEAD_STRIDE=d) if case == "head" else dict(TOKEN_STRIDE=d, HEAD_STRIDE=page * d)
        kw = dict(strides, BLOCK_N=rows, WIDTH=width, HEAD_MAJOR=True)
    slices = max(1, units // heads)
    per_prog = -(-tokens // slices)
    per_prog = -(-per_prog // rows) * rows  # whole tiles a program
    slices = tokens // per_prog  # whole slices inside the cache
    grid = slices * heads
    read = grid * per_prog * width * 2 * 2  # K and V, 2 bytes an element
    try:
        if case == "tma":
            launches = [_tma_launch(c, out, grid, per_prog, block_n, stages, args) for c in caches]
        else:
            launches = [lambda c=c: _read_kernel[(grid,)](c[0], c[1], out, per_prog, PAGE=page, PAGE_STRIDE=page * nkv * d,
                                                            NKV=nkv, STAGES=stages, num_warps=4, num_stages=stages, **kw)
                        for c in caches]
        us = chain_us(launches)
    except Exception as error:  # noqa: BLE001 - a launch that does not fit is reported, not fatal
        return dict(row, error=f"{type(error).__name__}: {str(error)[:200]}")
    return dict(row, grid=grid, us_a_layer=round(us, 2), tb_s=round(read / us / 1e6, 3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--page", type=int, default=64)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--quick", action="store_true", help="only two programs an SM, 64 keys a tile, 2 and 3 stages")
    args = parser.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    nkv, d, tokens = args.kv_heads, args.head_dim, args.tokens
    # One [2, tokens, nkv, d] cache a layer (K and V), pages in order: the layout is what varies, not the table.
    caches = [torch.randn(2, tokens * nkv * d, dtype=torch.bfloat16, device=dev) for _ in range(args.layers)]
    layer_bytes = 2 * tokens * nkv * d * 2
    out = torch.empty(8 * sms * nkv, dtype=torch.float32, device=dev)
    results = []

    # A copy of the same bytes, for the card's read-and-write rate (reported as read + write).
    dst = torch.empty_like(caches[0])
    copy_us = chain_us([lambda c=c: dst.copy_(c) for c in caches])
    results.append({"case": "copy (read + write)", "us_a_layer": copy_us, "tb_s": 2 * layer_bytes / copy_us / 1e6})

    for case in args.cases:
        for programs_per_sm in (2,) if args.quick else (2, 3):
            for block_n in (64,) if args.quick else (64, 128):
                for stages in (2, 3) if args.quick else (2, 3, 5):
                    results.append(run_case(case, programs_per_sm * sms, block_n, stages, caches, out, args))
                    print(results[-1], flush=True)
    meta = {"device": torch.cuda.get_device_name(dev), "triton": triton.__version__, "torch": torch.__version__,
            "tokens": tokens, "layers": args.layers, "layer_bytes": layer_bytes}
    with open(args.output, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    print(results[0])


if __name__ == "__main__":
    main()
