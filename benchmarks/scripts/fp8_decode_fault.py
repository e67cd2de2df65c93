"""Where does the illegal memory access after the FP8-cache decode sweep come from? The sweep's cases and
launches over the FP8 cache, one at a time, each synchronized and reported before the next: eager first, then
inside a CUDA graph (as ``do_bench_cudagraph`` times it), then the case's tensors freed and a new allocation made.
Run it with CUDA_LAUNCH_BLOCKING=1 (and under compute-sanitizer with --eager-only where one is installed).

    CUDA_LAUNCH_BLOCKING=1 python benchmarks/scripts/fp8_decode_fault.py [--eager-only]
"""

from __future__ import annotations

import argparse
import sys

import torch
from triton.testing import do_bench_cudagraph

from raygrid.kernels.paged_attention_ref import paged_attention_ref
from raygrid.kernels.triton_attention import paged_attention_decode

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from sweep_decode_kv_dtype import CASES, HEAD_DIM, LAUNCHES, PAGE  # noqa: E402


def step(label: str, fn) -> None:
    print(f"{label} ...", end=" ", flush=True)
    fn()
    torch.cuda.synchronize()
    print("ok", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--eager-only", action="store_true")
    parser.add_argument("--launches", default="all", choices=["all", "default", "eight-warps"],
                        help="the sweep's launches, the engine's alone, or the 8-warp launches the sweep left out")
    args = parser.parse_args()
    launches = {"all": LAUNCHES, "default": LAUNCHES[:1], "eight-warps": [(64, 8, 2), (128, 8, 2)]}[args.launches]
    for heads, kv_heads, seqs, context in CASES:
        blocks = seqs * -(-context // PAGE)
        cache = torch.randn(2, blocks + 1, PAGE, kv_heads, HEAD_DIM, device="cuda").to(torch.float8_e4m3fn)
        tables = (1 + torch.randperm(blocks, device="cuda")).view(seqs, -1).int()
        query = torch.randn(seqs, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
        case = f"{heads}/{kv_heads} {seqs}x{context}"
        for block_n, warps, stages in launches:
            def call():
                return paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=block_n,
                                              num_warps=warps, num_stages=stages)
            name = f"{case} block_n={block_n} warps={warps} stages={stages}"
            step(f"{name} eager", call)
            if seqs <= 32:
                got = call().float()
                want = paged_attention_ref(query, cache, tables, [context] * seqs, list(range(seqs + 1)), HEAD_DIM**-0.5).float()
                print(f"{name} max |diff| against the reference: {(got - want).abs().max().item():.3g}", flush=True)
            if not args.eager_only:
                step(f"{name} graph", lambda: do_bench_cudagraph(call, rep=30))
        cache = tables = query = lens = call = None
        step(f"{case} freed, then a new allocation", lambda: torch.randn(2, 1 << 20, device="cuda"))


if __name__ == "__main__":
    main()
