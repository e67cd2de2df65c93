"""Times the skinny linear kernel (raygrid/kernels/triton_linear.py) over launch configurations, split-K included,
against cuBLAS (``torch.nn.functional.linear``), at the weight shapes of Qwen3-0.6B, for 1 and 16 rows, in bf16; and
checks each launch's result against cuBLAS's.

Each timing is a chain of 28 launches over 28 different weights (one a layer, as a decode step reads them: no
weight comes from L2), captured in one CUDA graph with PDL as the engine launches them, replayed and timed with
CUDA events; the figure is per launch. A single launch timed alone (``do_bench``, or a graph of one weight) either
pays the launch overhead or reads the weight from L2. Last, the four layers' shapes chained as a decode step's
layers (qkv, o, gate_up, down; 28 layers) with cuBLAS, the default launches and each shape's best.

Stage 1 tries split-K, columns a program and the K tile at 4 warps and 4 stages; stage 2 tries warps and stages for
stage 1's best. ``--budget-s`` stops trying launches when it has run that long.

    python benchmarks/scripts/sweep_skinny_linear.py --output-json sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import torch.nn.functional as F

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_linear import skinny_config, skinny_linear

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # Qwen3-0.6B (N, K)
LAYERS = 28


def launch_name(launch: dict) -> str:
    return f"n{launch['block_n']} k{launch['block_k']} s{launch['split_k']} w{launch['num_warps']} p{launch['num_stages']}"


def sweep_shape(name, n, k, m, deadline) -> dict:
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for _ in range(LAYERS)]
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    expected = F.linear(x, weights[0]).float()
    bytes_read = n * k * 2
    row = {"shape": name, "n": n, "k": k, "m": m, "default": skinny_config(n, k), "launches": []}
    row["cublas_us"] = round(chain_us([lambda w=w: F.linear(x, w) for w in weights]), 2)
    row["default_us"] = round(chain_us([lambda w=w: skinny_linear(x, w) for w in weights]), 2)

    def attempt(launch):
        if time.monotonic() > deadline:
            return None
        record = dict(launch)
        try:
            error = (skinny_linear(x, weights[0], **launch).float() - expected).abs().max().item()
            us = chain_us([lambda w=w: skinny_linear(x, w, **launch) for w in weights])
            record.update(us=round(us, 2), tb_per_s=round(bytes_read / us / 1e6, 2), max_abs_error=error)
        except Exception as failure:  # noqa: BLE001 - a launch that does not fit is recorded
            record["error"] = f"{type(failure).__name__}: {str(failure)[:120]}"
        row["launches"].append(record)
        return record

    stage1 = [dict(block_n=bn, block_k=bk, split_k=s, num_warps=4, num_stages=4)
              for s, bn, bk in itertools.product((1, 2, 4), (16, 32, 64), (128, 256))]
    done = [r for r in map(attempt, stage1) if r and "us" in r]
    if done:
        best = min(done, key=lambda r: r["us"])
        shape_of = {key: best[key] for key in ("block_n", "block_k", "split_k")}
        for warps, stages in itertools.product((2, 4, 8), (2, 3, 4, 6)):
            if (warps, stages) != (4, 4):
                attempt(dict(shape_of, num_warps=warps, num_stages=stages))
    timed = [r for r in row["launches"] if "us" in r]
    if timed:
        best = min(timed, key=lambda r: r["us"])
        row["best"] = {key: best[key] for key in ("block_n", "block_k", "split_k", "num_warps", "num_stages", "us")}
    print(f"{name:8s} M={m:2d}: cuBLAS {row['cublas_us']:6.2f} us, default {row['default_us']:6.2f} us, best "
          f"{row['best']['us'] if timed else float('nan'):6.2f} us ({launch_name(row['best']) if timed else '-'}), "
          f"{bytes_read / 1e6:.1f} MB a weight", flush=True)
    return row


def layer_chain(m: int, best: dict[str, dict]) -> dict:
    """A decode step's linear layers at ``m`` rows: qkv, o, gate_up, down for 28 layers, per layer."""
    layers = [{name: torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5 for name, (n, k) in SHAPES.items()}
              for _ in range(LAYERS)]
    inputs = {name: torch.randn(m, k, dtype=torch.bfloat16, device="cuda") for name, (n, k) in SHAPES.items()}

    def calls(linear):
        return [lambda name=name, layer=layer: linear(name, inputs[name], layer[name]) for layer in layers for name in SHAPES]

    def tuned(name, x, w):
        launch = {key: best[name][key] for key in ("block_n", "block_k", "split_k", "num_warps", "num_stages")}
        return skinny_linear(x, w, **launch)

    per_call = {"cublas": chain_us(calls(lambda name, x, w: F.linear(x, w))),
                "default": chain_us(calls(lambda name, x, w: skinny_linear(x, w)))}
    if all(name in best for name in SHAPES):
        per_call["best"] = chain_us(calls(tuned))
    return {f"{key}_us_per_layer": round(us * len(SHAPES), 2) for key, us in per_call.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--budget-s", type=float, default=240.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    results, chains = [], {}
    for m in (1, 16):
        rows = [sweep_shape(name, n, k, m, deadline) for name, (n, k) in SHAPES.items()]
        results += rows
        chains[f"m{m}"] = layer_chain(m, {r["shape"]: r["best"] for r in rows if "best" in r})
        print(f"layer chain M={m}: {chains[f'm{m}']}", flush=True)
        if args.output_json:
            with open(args.output_json, "w", encoding="utf-8") as f:
                json.dump({**provenance(), "results": results, "layer_chains": chains}, f, indent=1)


if __name__ == "__main__":
    main()
