"""The attention kernels over the two KV cache layouts (``ops.new_kv_cache``): "nhd" (a token's kv heads side by
side) and "hnd" (each block's page of one kv head contiguous). The same keys and values in the same random pages,
read by the default launches inside CUDA graphs (``do_bench_cudagraph``, so launch overhead is left out), with
both layouts' outputs compared bit for bit. Qwen3-0.6B's heads (16 / 8) and the 8B's (32 / 8), head_dim 128,
16-token pages, bf16 and FP8 caches. Decode counts the cache bytes read (TB/s); prefill counts causal FLOPs at
half (TFLOP/s); the store counts the bytes written.

    python benchmarks/scripts/sweep_kv_layout.py --output-json OUT.json
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench_cudagraph

from raygrid.bench.throughput import provenance
from raygrid.kernels.ops import KV_LAYOUTS, new_kv_cache
from raygrid.kernels.triton_attention import paged_attention_decode, paged_attention_prefill, store_kv

HEAD_DIM, PAGE = 128, 16
# (heads, kv heads, sequences, context): W1's decode batches, the mixed step's, and batch-1 long contexts.
DECODE = [(16, 8, 256, 530), (16, 8, 128, 1200), (16, 8, 32, 1536), (16, 8, 1, 8192), (16, 8, 1, 32768),
          (32, 8, 256, 530)]
PREFILL = [(16, 8, 1, 8192), (16, 8, 1, 32768), (16, 8, 8, 2048)]  # (heads, kv heads, sequences, prompt length)


def caches(seqs: int, context: int, kv_heads: int, dtype: torch.dtype):
    """The same random keys and values in both layouts, at the same random pages."""
    blocks = seqs * -(-context // PAGE)
    values = torch.randn(2, blocks + 1, PAGE, kv_heads, HEAD_DIM, device="cuda").to(dtype)
    tables = (1 + torch.randperm(blocks, device="cuda")).view(seqs, -1).int()
    out = {}
    for layout in KV_LAYOUTS:
        cache = new_kv_cache(tuple(values.shape), dtype, "cuda", layout)
        cache.copy_(values)
        out[layout] = cache
    return out, tables


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--kv-dtypes", nargs="+", default=["bfloat16", "fp8"], choices=["bfloat16", "fp8"])
    parser.add_argument("--rep", type=int, default=50, help="milliseconds of replays per timing")
    args = parser.parse_args()
    rows = []

    def record(row: dict, results: dict) -> None:
        rows.append({**row, **results})
        print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)

    for kv_dtype in args.kv_dtypes:
        dtype = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.bfloat16
        elem = 1 if kv_dtype == "fp8" else 2
        for heads, kv_heads, seqs, context in DECODE:
            by_layout, tables = caches(seqs, context, kv_heads, dtype)
            query = torch.randn(seqs, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            lens = torch.full((seqs,), context, dtype=torch.int32, device="cuda")
            kv_bytes = seqs * context * kv_heads * HEAD_DIM * 2 * elem
            outs, results = {}, {}
            for layout, cache in by_layout.items():
                outs[layout] = paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5)
                us = do_bench_cudagraph(lambda: paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5),
                                        rep=args.rep) * 1e3
                results[f"{layout}_us"] = round(us, 1)
                results[f"{layout}_tb_per_s"] = round(kv_bytes / us / 1e6, 2)
            results["equal"] = bool(torch.equal(outs["nhd"], outs["hnd"]))
            record(dict(kernel="decode", kv_dtype=kv_dtype, heads=heads, kv_heads=kv_heads, seqs=seqs, context=context), results)
            del by_layout
        for heads, kv_heads, seqs, length in PREFILL:
            by_layout, tables = caches(seqs, length, kv_heads, dtype)
            query = torch.randn(seqs * length, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
            lens = torch.full((seqs,), length, dtype=torch.int32, device="cuda")
            starts = torch.arange(0, (seqs + 1) * length, length, dtype=torch.int32, device="cuda")
            flops = seqs * 4 * length * length * HEAD_DIM * heads / 2
            outs, results = {}, {}
            for layout, cache in by_layout.items():
                outs[layout] = paged_attention_prefill(query, cache, tables, lens, starts, HEAD_DIM**-0.5)
                ms = do_bench_cudagraph(lambda: paged_attention_prefill(query, cache, tables, lens, starts, HEAD_DIM**-0.5),
                                        rep=args.rep)
                results[f"{layout}_ms"] = round(ms, 3)
                results[f"{layout}_tflop_per_s"] = round(flops / ms / 1e9, 1)
            results["equal"] = bool(torch.equal(outs["nhd"], outs["hnd"]))
            record(dict(kernel="prefill", kv_dtype=kv_dtype, heads=heads, kv_heads=kv_heads, seqs=seqs, length=length), results)
            # The store: a step's new keys and values (8,192 tokens at scattered slots).
            key, value = (torch.randn(8192, kv_heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            slots = torch.randperm(seqs * length, device="cuda")[:8192] + PAGE
            results = {}
            for layout, cache in by_layout.items():
                us = do_bench_cudagraph(lambda: store_kv(key, value, cache, slots), rep=args.rep) * 1e3
                results[f"{layout}_us"] = round(us, 1)
                results[f"{layout}_tb_per_s"] = round(2 * key.numel() * elem / us / 1e6, 2)
            results["equal"] = bool(torch.equal(by_layout["nhd"], by_layout["hnd"]))
            record(dict(kernel="store", kv_dtype=kv_dtype, kv_heads=kv_heads, tokens=8192), results)
            del by_layout
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
