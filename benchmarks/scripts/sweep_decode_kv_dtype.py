"""The paged decode attention kernel over a bf16 and an FP8 (e4m3) KV cache, at the shapes of W1's decode steps
on the 8B-shaped Llama (32 heads, 8 kv heads) and on Qwen3-0.6B (16, 8), head_dim 128, pages (64 tokens, a GPU
engine's default, unless --page) in random order. Timed inside CUDA graphs (``do_bench_cudagraph``), so launch
overhead is left out; TB/s counts the cache bytes read. Launches: block_n x warps x stages over a grid, 1 and 2 warps
among them (a program's 16 query rows fit one warp's matrix products, so fewer warps need no cross-warp reductions).
Batch 1 takes the split count the engine would.

    python benchmarks/scripts/sweep_decode_kv_dtype.py --output-json OUT.json [--kv-dtypes fp8] [--launches 128x4x3,...]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from raygrid.bench.kernel_timing import cuda_graph_ms
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_attention import paged_attention_decode

HEAD_DIM = 128
CASES = [(32, 8, 256, 530), (32, 8, 128, 1200), (32, 8, 32, 1536), (16, 8, 256, 530), (16, 8, 192, 862),
         (16, 8, 1, 32768)]
# block_n, warps, stages. Before bc23b47 the next CUDA call after the FP8 cases failed with an illegal memory access
# in some runs of this script: cuda_graph_ms did not wait for the inputs the default stream was still writing.
LAUNCHES = list(itertools.product((32, 64, 128), (1, 2, 4), (2,))) + [(64, 1, 3), (64, 2, 3), (128, 2, 3), (64, 4, 3),
                                                                    (64, 8, 2), (128, 8, 2)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--label", default="", help="a name for this run of the kernel (A/B runs)")
    parser.add_argument("--kv-dtypes", nargs="+", default=["bfloat16", "fp8"], choices=["bfloat16", "fp8"])
    parser.add_argument("--launches", default=None, help="block_n x warps x stages, comma-separated, e.g. 128x4x3,128x8x2")
    parser.add_argument("--page", type=int, default=64, help="tokens a page")
    parser.add_argument("--cases", default=None, help="heads x kv_heads x sequences x context, comma-separated")
    args = parser.parse_args()
    launches = LAUNCHES if args.launches is None else [tuple(int(x) for x in s.split("x")) for s in args.launches.split(",")]
    cases = CASES if args.cases is None else [tuple(int(x) for x in s.split("x")) for s in args.cases.split(",")]
    page = args.page
    rows = []
    for (heads, kv_heads, seqs, context), kv_dtype in itertools.product(cases, args.kv_dtypes):
        blocks = seqs * -(-context // page)
        cache = torch.randn(2, blocks + 1, page, kv_heads, HEAD_DIM, device="cuda")
        cache = cache.to(torch.float8_e4m3fn if kv_dtype == "fp8" else torch.bfloat16)
        tables = (1 + torch.randperm(blocks, device="cuda")).view(seqs, -1).int()
        query = torch.randn(seqs, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
        kv_bytes = seqs * context * kv_heads * HEAD_DIM * 2 * cache.element_size()
        expected = paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=64, num_warps=4, num_stages=2)
        for block_n, warps, stages in launches:
            row = dict(heads=heads, kv_heads=kv_heads, seqs=seqs, context=context, kv_dtype=kv_dtype, page=page,
                       block_n=block_n, warps=warps, stages=stages, label=args.label)
            def launch():
                return paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=block_n, num_warps=warps,
                                              num_stages=stages)
            try:
                diff = (launch().float() - expected.float()).abs().max().item()  # against 64 keys, 4 warps, 2 stages
                us = cuda_graph_ms(launch, rep=30) * 1e3
            except Exception as error:  # noqa: BLE001 - a launch that does not fit is recorded, not fatal
                rows.append({**row, "error": f"{type(error).__name__}: {str(error)[:120]}"})
                continue
            rows.append({**row, "us": round(us, 1), "tb_per_s": round(kv_bytes / us / 1e6, 2), "max_abs_diff": diff})
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
