"""The fused MoE kernel at Qwen3-30B-A3B's sizes (hidden 2048, 128 experts of intermediate 768, top-8,
bf16) on one GPU: each batch size's error against the torch reference, the time of the kernel (CUDA-graph
replay) against the reference and against the memory floor of the expert weights it touches, and a sweep
of tile configurations for each of its two GEMMs.

    python benchmarks/scripts/moe_kernel.py OUT.json [--tokens 1 16 256 ...] [--no-sweep]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch
import triton

from raygrid.bench.kernel_timing import cuda_graph_ms
from raygrid.bench.memory_floor import H200_BANDWIDTH, experts_touched
from raygrid.bench.throughput import device_name, git_commit
from raygrid.kernels.moe_ref import align_by_expert_ref, fused_moe_ref, route_ref
from raygrid.kernels.triton_moe import Tiles, _grouped_gemm, align_by_expert, choose_tiles, fused_moe
from raygrid.kernels.triton_ops import silu_and_mul

CANDIDATES = [Tiles(m, n, k, group_m=8 if m >= 64 else 1, num_warps=w, num_stages=s)
              for m, n, k, (w, s) in itertools.product((16, 32, 64, 128), (64, 128), (64, 128), ((4, 3), (8, 4)))]


def bench(fn) -> float:
    return cuda_graph_ms(fn, rep=20) * 1e3  # us


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 1024, 2048, 8192])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    E, k, H, I = args.experts, args.top_k, args.hidden, args.intermediate
    torch.manual_seed(0)
    dev = "cuda"
    w13 = (torch.randn(E, 2 * I, H, device=dev) / H**0.5).bfloat16()
    w2 = (torch.randn(E, H, I, device=dev) / I**0.5).bfloat16()
    rows = []
    for T in args.tokens:
        x = torch.randn(T, H, device=dev, dtype=torch.bfloat16)
        weights, ids = route_ref(torch.randn(T, E, device=dev, dtype=torch.bfloat16), k, renormalize=True)
        got = fused_moe(x, w13, w2, weights, ids)
        want = fused_moe_ref(x.float(), w13.float(), w2.float(), weights.float(), ids)  # exact arithmetic
        want_bf16 = fused_moe_ref(x, w13, w2, weights, ids)
        err = (got.float() - want).abs().max().item()
        err_ref_bf16 = (want_bf16.float() - want).abs().max().item()
        touched = experts_touched(E, k, T)
        floor_us = touched * 3 * H * I * 2 / H200_BANDWIDTH * 1e6
        row = {"tokens": T, "pairs": T * k, "max_abs_err_vs_fp32": err, "ref_bf16_max_abs_err_vs_fp32": err_ref_bf16,
               "scale": want.abs().max().item(), "experts_touched": round(touched, 1), "weight_floor_us": floor_us,
               "tiles": [t.__dict__ for t in choose_tiles(T * k)],
               "kernel_us": bench(lambda: fused_moe(x, w13, w2, weights, ids)),
               "align_us": bench(lambda: align_by_expert(ids, E, choose_tiles(T * k)[0].block_m)),
               "align_ref_us": bench(lambda: align_by_expert_ref(ids, E, choose_tiles(T * k)[0].block_m))}
        start = time.perf_counter()
        for _ in range(3):
            fused_moe_ref(x, w13, w2, weights, ids)
        torch.cuda.synchronize()
        row["ref_us"] = (time.perf_counter() - start) / 3 * 1e6  # eager: the reference loops on the host
        row["kernel_over_floor"] = row["kernel_us"] / floor_us
        if not args.no_sweep:
            row["sweep"] = sweep(x, w13, w2, weights, ids, E, k)
        print(json.dumps({key: v for key, v in row.items() if key != "sweep"}), flush=True)
        if "sweep" in row:
            print("   best gate_up", row["sweep"]["gate_up"][0], "\n   best down", row["sweep"]["down"][0], flush=True)
        rows.append(row)
    result = {"shape": {"experts": E, "top_k": k, "hidden": H, "intermediate": I, "dtype": "bfloat16"},
              "rows": rows, "machine": device_name(), "commit": git_commit(),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)


def sweep(x, w13, w2, weights, ids, E, k) -> dict:
    """Each GEMM alone under every candidate: gate_up ([T*k, 2I] from x) and down ([T*k, H] from the
    activations, times the routing weight). Sorted fastest first."""
    T = x.shape[0]
    pairs = T * k
    flat_weights = weights.contiguous().view(-1)
    out = {"gate_up": [], "down": []}
    for tiles in CANDIDATES:
        sorted_pairs, block_expert, num_padded = align_by_expert(ids, E, tiles.block_m)
        gate_up = torch.empty(pairs, w13.shape[1], dtype=x.dtype, device=x.device)
        act = silu_and_mul(torch.randn_like(gate_up))
        down = torch.empty(pairs, w2.shape[1], dtype=x.dtype, device=x.device)
        try:
            g = bench(lambda: _grouped_gemm(x, w13, gate_up, weights, sorted_pairs, block_expert, num_padded, k, False, tiles))
            d = bench(lambda: _grouped_gemm(act, w2, down, flat_weights, sorted_pairs, block_expert, num_padded, 1, True, tiles))
        except (triton.runtime.errors.OutOfResources, RuntimeError) as e:  # too much shared memory
            print("   skip", tiles, type(e).__name__, flush=True)
            continue
        out["gate_up"].append({"us": g, **tiles.__dict__})
        out["down"].append({"us": d, **tiles.__dict__})
    for key in out:
        out[key].sort(key=lambda r: r["us"])
    return out


if __name__ == "__main__":
    main()
