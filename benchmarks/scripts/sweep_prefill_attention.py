"""Times the paged prefill attention kernel over launch configurations on the GPU, against PyTorch's fused
attention (``scaled_dot_product_attention``, causal, on contiguous K/V: what transformers' sdpa path runs),
at Qwen3-0.6B's heads (16 query heads, 8 kv heads, head_dim 128, bf16, 16-token pages unless --page). Throughput counts
causal FLOPs at half: 4 x N^2 x head_dim x heads / 2 per sequence. Every configuration's output is
checked against PyTorch's.

A case ``SxN@P`` is a chunk of a longer prompt, as the engine runs one (8,192 tokens a step by default): N queries
of each of S sequences after P cached tokens. Its FLOPs are 4 x N x (P + N / 2) x head_dim x heads, and its
reference is the last N rows of SDPA over all P + N tokens; SDPA is timed only on whole prompts.

    python benchmarks/scripts/sweep_prefill_attention.py --output-json sweep.json [--cases 1x8192,1x8192@24576]
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_attention import PREFILL_CONFIG, _prefill_kernel, paged_attention_prefill

HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 16  # PAGE: the default of --page
# (sequences, queries, cached prefix): whole prompts, then the last three chunks of a 32k prompt.
CASES = [(1, 4096, 0), (1, 8192, 0), (1, 16384, 0), (1, 32768, 0), (8, 8192, 0), (1, 8192, 8192), (1, 8192, 16384),
         (1, 8192, 24576)]


def make_case(num_seqs: int, length: int, prefix: int = 0, page_order: str = "random", page: int = PAGE):
    """Packed queries (the last ``length - prefix`` tokens of each sequence) and a paged cache holding the
    same keys and values in scattered pages, and the contiguous [seqs, heads, N, d] tensors PyTorch's kernel
    reads."""
    q = torch.randn(num_seqs, HEADS, length, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(num_seqs, KV_HEADS, length, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(num_seqs, KV_HEADS, length, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    pages = length // page
    order = torch.randperm(num_seqs * pages, device="cuda") if page_order == "random" else torch.arange(num_seqs * pages, device="cuda")
    tables = (1 + order).view(num_seqs, pages).int()
    cache = torch.empty(2, num_seqs * pages + 1, page, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    for s in range(num_seqs):
        cache[0, tables[s].long()] = k[s].transpose(0, 1).reshape(pages, page, KV_HEADS, HEAD_DIM)
        cache[1, tables[s].long()] = v[s].transpose(0, 1).reshape(pages, page, KV_HEADS, HEAD_DIM)
    queries = length - prefix
    packed = q[:, :, prefix:].transpose(1, 2).reshape(num_seqs * queries, HEADS, HEAD_DIM).contiguous()
    lens = torch.full((num_seqs,), length, dtype=torch.int32, device="cuda")
    starts = torch.arange(0, (num_seqs + 1) * queries, queries, dtype=torch.int32, device="cuda")
    return (q, k, v), (packed, cache, tables, lens, starts)


def compiled_kernels(fn) -> dict:
    """The variants of a Triton kernel compiled so far in this process, by their cache key."""
    return {key: kernel for entry in fn.device_caches.values() for key, kernel in entry[0].items()}


def resources(kernel) -> dict:
    """What a compiled variant holds of an SM: registers a thread, spilled registers, shared memory (bytes)."""
    return {"regs": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
            "shared": getattr(getattr(kernel, "metadata", None), "shared", None)}


def parse_case(text: str) -> tuple[int, int, int]:
    """'SxN' or 'SxN@P' as (sequences, queries, cached prefix)."""
    shape, _, prefix = text.partition("@")
    num_seqs, length = (int(x) for x in shape.split("x"))
    return num_seqs, length, int(prefix or 0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--quick", action="store_true", help="the default configuration only")
    parser.add_argument("--config", action="append", default=[], metavar="JSON",
                        help="a launch to time, as changes to the default (repeatable), e.g. '{\"pipeline\": true}'")
    parser.add_argument("--cases", default=None, help="sequences x length pairs, e.g. 1x8192,1x32768")
    parser.add_argument("--page", type=int, default=PAGE, help="tokens a cache page (the engine's block_size)")
    parser.add_argument("--page-order", default="random", choices=["random", "ascending"],
                        help="the sequences' pages in the cache: scattered, or in order as a fresh engine hands them out")
    args = parser.parse_args()
    cases = CASES if args.cases is None else [parse_case(c) for c in args.cases.split(",")]
    if args.config:
        configs = [{**PREFILL_CONFIG, **json.loads(c)} for c in args.config]
    elif args.quick:
        configs = [dict(PREFILL_CONFIG)]
    else:
        # (block_m, block_n, warps, stages); each with one query head a program and with two sharing their kv head.
        # Warp specialization (tl.range's) is left out: Triton 3.6 fails to compile it at 4 warps and ignores it at 8.
        launches = [(128, 64, 4, 3), (128, 64, 4, 4), (128, 128, 8, 3), (128, 128, 8, 4), (256, 64, 8, 2), (256, 64, 8, 3),
                    (256, 128, 8, 2), (128, 64, 8, 3)]
        configs = [dict(block_m=m, block_n=n, num_warps=w, num_stages=s, pack=pack)
                   for (m, n, w, s), pack in itertools.product(launches, (1, 2))] + [
                   dict(block_m=64, block_n=64, num_warps=4, num_stages=2, pack=1)]
    results = []
    held = {}  # a configuration's compiled resources (registers, spills, shared memory), from its first compilation
    for num_seqs, length, prefix in cases:
        (q, k, v), (packed, cache, tables, lens, starts) = make_case(num_seqs, prefix + length, prefix, args.page_order, args.page)
        scale = HEAD_DIM**-0.5
        flops = num_seqs * 4 * length * (prefix + length / 2) * HEAD_DIM * HEADS

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)

        expected = sdpa()[:, :, prefix:].transpose(1, 2).reshape(num_seqs * length, HEADS, HEAD_DIM)
        if not prefix:
            ms = do_bench(sdpa, warmup=5, rep=40)
            results.append({"seqs": num_seqs, "len": length, "kernel": "torch sdpa", "ms": round(ms, 3),
                            "tflop_per_s": round(flops / ms / 1e9, 1)})
            print(f"{num_seqs} x {length}: torch sdpa {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s)", flush=True)
        for config in configs:
            row = {"seqs": num_seqs, "len": length, "prefix": prefix, "page": args.page, "pages": args.page_order, "kernel": "raygrid",
                   **config}

            def ours():
                return paged_attention_prefill(packed, cache, tables, lens, starts, scale, **config)

            try:
                before = compiled_kernels(_prefill_kernel)
                error = (ours().float() - expected.float()).abs().max().item()
                new = [k for key, k in compiled_kernels(_prefill_kernel).items() if key not in before]
                key = json.dumps(config, sort_keys=True)
                if new:
                    held[key] = resources(new[-1])
                ms = do_bench(ours, warmup=5, rep=40)
            except Exception as exc:  # noqa: BLE001 - a configuration that does not compile or fit is recorded
                results.append({**row, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            results.append({**row, "ms": round(ms, 3), "tflop_per_s": round(flops / ms / 1e9, 1), "max_abs_error": error,
                            **held.get(key, {})})
        mine = [r for r in results if r.get("prefix") == prefix and r["seqs"] == num_seqs and r["len"] == length
                and "ms" in r]
        for r in sorted(mine, key=lambda r: r["ms"])[:3]:
            print(f"  {num_seqs} x {length} @ {prefix}: {r}", flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "triton": __import__("triton").__version__, "torch": torch.__version__,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
