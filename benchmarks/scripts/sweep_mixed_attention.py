"""Attention of a mixed step on the GPU: many decode rows (one query each) beside a few prompts. Times the
prefill kernel over the whole batch across launch configurations, and the split launch (the decode kernel
over the decode rows, the prefill kernel over the prompts), at Qwen3-0.6B's heads (16 query heads, 8 kv
heads, head_dim 128, bf16, 64-token pages as a GPU engine's, or --page). Every launch's output is checked against
the default launch's. Where pages hold whole key tiles, each launch runs with tiles gathered by rows and by bulk copy.

    python benchmarks/scripts/sweep_mixed_attention.py --output-json sweep.json [--decodes 256 --context 640 --prompts 2 --prompt-len 512 --page 64]
        [--quick]   # only the engine's launches (16- and 128-row tiles), the split and the concurrent launches
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from raygrid.bench.kernel_timing import cuda_graph_ms
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_attention import paged_attention_decode, paged_attention_prefill

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128


def make_case(decodes: int, context: int, prompts: int, prompt_len: int, page: int):
    """Packed queries (decode rows first), a paged cache in scattered pages, and the batch's metadata."""
    q_lens = [1] * decodes + [prompt_len] * prompts
    seq_lens = [context] * decodes + [prompt_len] * prompts
    pages = [-(-s // page) for s in seq_lens]
    max_pages = max(pages)
    total_pages = sum(pages)
    order = 1 + torch.randperm(total_pages, device="cuda")
    tables = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(pages):
        tables[i, :n] = order[at : at + n].int()
        at += n
    cache = torch.randn(2, total_pages + 1, page, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    query = torch.randn(sum(q_lens), HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    starts = torch.tensor([0] + list(itertools.accumulate(q_lens)), dtype=torch.int32, device="cuda")
    lens = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    return query, cache, tables, lens, starts, max(q_lens)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", required=True)
    parser.add_argument("--decodes", type=int, default=256)
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--page", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="only the engine's two tile shapes of the prefill kernel")
    args = parser.parse_args()
    torch.manual_seed(0)
    query, cache, tables, lens, starts, _ = make_case(args.decodes, args.context, args.prompts, args.prompt_len, args.page)
    scale = HEAD_DIM**-0.5
    d = args.decodes
    reference = paged_attention_prefill(query, cache, tables, lens, starts, scale)
    rows = []

    def record(name: str, fn) -> None:
        out = fn()
        torch.cuda.synchronize()
        error = (out.float() - reference.float()).abs().max().item()
        ms = cuda_graph_ms(fn)  # replayed from a CUDA graph, as the engine's mixed steps are: no launch overhead
        rows.append({"launch": name, "ms": ms, "max_abs_error": error})
        print(f"{name:55s} {ms * 1e3:8.1f} us   max error {error:.2e}", flush=True)

    if d:
        record("decode kernel alone (decode rows only, not checked)", lambda: torch.cat([
            paged_attention_decode(query[:d], cache, tables[:d], lens[:d], scale), reference[d:]]))
    bulk = (False, True) if args.page % 64 == 0 else (False,)
    for block_m, pack, block_n, warps, stages, tma in itertools.product((16, 32, 64, 128), (1, 2), (64,), (4,), (2, 3), bulk):
        if block_m // pack < 1:
            continue
        if args.quick and (pack, stages, tma) not in ((2, 2, False), (2, 3, True)) or args.quick and block_m in (32, 64):
            continue
        name = f"prefill kernel, block_m={block_m} pack={pack} block_n={block_n} warps={warps} stages={stages} tma={tma}"
        record(name, lambda: paged_attention_prefill(query, cache, tables, lens, starts, scale, block_m=block_m,
                                                      block_n=block_n, num_warps=warps, num_stages=stages, pack=pack, tma=tma))
    if d and args.prompts:
        def split():
            out = torch.empty_like(query)
            paged_attention_decode(query[:d], cache, tables[:d], lens[:d], scale, out=out[:d])
            paged_attention_prefill(query, cache, tables[d:], lens[d:], starts[d:], scale, out=out)
            return out
        record("split: decode kernel + prefill kernel (default)", split)
        # The two launches of the split side by side: the prompts' kernel on a second stream. A small prompt launch
        # is latency-bound, and the decode launch alone leaves no SM idle only until its tail.
        side = torch.cuda.Stream()
        for block_m, pack in ((16, 2), (64, 2), (128, 2)):
            cfg = dict(block_m=block_m, pack=pack, num_stages=2 if block_m < 64 else 3)
            record(f"prompts alone, prefill kernel block_m={block_m} (not checked)", lambda: torch.cat([
                reference[:d], paged_attention_prefill(query, cache, tables[d:], lens[d:], starts[d:], scale, **cfg)[d:]]))
            for prompts_first in (True, False):
                def concurrent():
                    out = torch.empty_like(query)
                    side.wait_stream(torch.cuda.current_stream())
                    launches = [lambda: paged_attention_decode(query[:d], cache, tables[:d], lens[:d], scale, out=out[:d])]
                    def prompts():
                        with torch.cuda.stream(side):
                            paged_attention_prefill(query, cache, tables[d:], lens[d:], starts[d:], scale, out=out, **cfg)
                    launches.insert(0 if prompts_first else 1, prompts)
                    for launch in launches:
                        launch()
                    torch.cuda.current_stream().wait_stream(side)
                    return out
                record(f"concurrent: prompts (block_m={block_m}) on a second stream, {'first' if prompts_first else 'second'}",
                       concurrent)
    rows.sort(key=lambda r: r["ms"])
    result = {"case": vars(args), "launches": rows, **provenance()}
    with open(args.output_json, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
