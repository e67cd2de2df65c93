"""Gluon prompt-kernel variants against the default launch, in one process: ``gluon_attention._prefill_kernel``
launched as the engine launches it, then with each ``--variant`` (constexprs, e.g. a switch a candidate diff adds),
alternating twice, on the prefill sweep's long cases (Qwen3-0.6B's heads, bf16, 64-token pages in random order).
Prints and writes TFLOP/s, counting causal FLOPs at half, and each launch's largest error against PyTorch's SDPA.
benchmarks/README.md ("The prompt kernel without its softmax") used it for the candidates in
results/softmax_probes_h200/.

    python benchmarks/scripts/ab_gluon_constexpr.py --variant '{"LAZY": true}' --output-json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from raygrid.bench.throughput import provenance
from raygrid.kernels import gluon_attention

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_prefill_attention import HEAD_DIM, HEADS, make_case, parse_case  # noqa: E402

CASES = "1x8192,1x32768,8x8192,1x8192@8192,1x8192@16384,1x8192@24576,1x4096"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variant", action="append", default=[], metavar="JSON",
                        help="constexprs of a candidate launch (repeatable), e.g. '{\"LAZY\": true}'")
    parser.add_argument("--cases", default=CASES)
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args()
    scale = HEAD_DIM**-0.5
    results = []
    for num_seqs, length, prefix in (parse_case(c) for c in args.cases.split(",")):
        (q, k, v), (packed, cache, tables, lens, starts) = make_case(num_seqs, prefix + length, prefix, "random", 64)
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
        expected = expected[:, :, prefix:].transpose(1, 2).reshape(num_seqs * length, HEADS, HEAD_DIM).float()
        out = torch.empty_like(packed)
        flops = num_seqs * 4 * length * (prefix + length / 2) * HEAD_DIM * HEADS
        for _ in range(2):
            for variant in [{}] + [json.loads(v) for v in args.variant]:
                def launch():
                    return gluon_attention.paged_attention_prefill(packed, cache, tables, lens, starts, scale, out,
                                                                   **variant)
                error = (launch().float() - expected).abs().max().item()
                ms = do_bench(launch, warmup=5, rep=40)
                results.append(dict(case=f"{num_seqs}x{length}@{prefix}", variant=variant, ms=round(ms, 3),
                                    tflop_per_s=round(flops / ms / 1e9, 1), max_abs_error=error))
                print(results[-1], flush=True)
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump({**provenance(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
