"""Times the paged decode attention kernel over launch configurations on the GPU, at the shapes of the
throughput benchmark (Qwen3-0.6B: 16 heads, 8 kv heads, head_dim 128, bf16, 16-token pages):
a full batch early in the run and smaller batches of longer sequences later in it, and a few long
sequences alone (interactive serving), where splitting the context matters.

    python benchmarks/scripts/sweep_decode_attention.py --output-json sweep.json
    python benchmarks/scripts/sweep_decode_attention.py --default-config-only   # splits on and off only
    python benchmarks/scripts/sweep_decode_attention.py --long   # a few long sequences: more slices, shorter ones
    python benchmarks/scripts/sweep_decode_attention.py --policies   # the split policy against the one before it
    python benchmarks/scripts/sweep_decode_attention.py --tma   # 64-token pages: tiles gathered by rows or bulk copied
    python benchmarks/scripts/sweep_decode_attention.py --placement   # pages packed or spread over a cache as large
                                                                      # as an engine's layer has (4.6 GB)
    python benchmarks/scripts/sweep_decode_attention.py --order   # contexts of unequal lengths, as W1's, in the
                                                                  # batch's order or the longest first
    python benchmarks/scripts/sweep_decode_attention.py --order --order-launches 128x4x2,32x1x2 --order-kv-dtype fp8 \
        --order-heads 32   # under given launches, over a bf16 or FP8 cache: sequences started in the batch's order
                           # or longest first
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch
from triton.testing import do_bench

from raygrid.bench.throughput import provenance
from raygrid.kernels.triton_attention import decode_splits, paged_attention_decode

HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 16
CASES = [(256, 530), (128, 1200), (32, 1536), (8, 1800), (4, 8192), (1, 16384)]  # (sequences, context length)
LONG_CASES = [(1, 32768), (1, 8192), (2, 16384), (4, 8192)]
# Pipeline stages the sweeps try. With the block table's load ahead of the K/V copies, Triton (3.6 to 3.9) keeps one
# K/V buffer up to 4 stages; 5 is the first that holds two tiles in flight (benchmarks/README.md, tenth session).
STAGES = (2, 3, 5)


def make_case(num_seqs: int, context: int, page: int = PAGE, heads: int = HEADS):
    blocks_per_seq = -(-context // page)
    cache = torch.randn(2, num_seqs * blocks_per_seq + 1, page, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    tables = (1 + torch.randperm(num_seqs * blocks_per_seq, device="cuda")).view(num_seqs, blocks_per_seq).int()
    query = torch.randn(num_seqs, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    lens = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")
    return query, cache, tables, lens


def kv_bytes(tokens: int, element_size: int = 2) -> int:
    """What decode reads of the cache for ``tokens`` context tokens: keys and values of every kv head (bf16 unless
    told)."""
    return tokens * KV_HEADS * HEAD_DIM * 2 * element_size


def timing(read_bytes: int, ms: float) -> dict:
    """A launch's time and the bandwidth it moved ``read_bytes`` at."""
    return {"us": round(ms * 1e3, 1), "tb_per_s": round(read_bytes / ms / 1e9, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--default-config-only", action="store_true", help="block_n 64, 4 warps, 2 stages")
    parser.add_argument("--long", action="store_true", help="batches of 1 to 4 long sequences, with 16 to 128 slices "
                                                            "of at least 256 or 512 tokens")
    parser.add_argument("--policies", action="store_true", help="every case under the current split policy and the "
                                                                "one before it (1 program per SM, 16 slices of 512 at most)")
    parser.add_argument("--tma", action="store_true", help="64-token pages (a GPU engine's), 64-key tiles gathered by "
                                                           "rows or bulk copied, over warps and stages; 16-token pages "
                                                           "gathered by the old default alongside")
    parser.add_argument("--long-bulk", action="store_true", help="batches of 1 or 2 long sequences over 64-token pages "
                                                                 "by bulk copy (the engine's split launches): slices "
                                                                 "from 1 to 8 programs an SM, their least length, stages")
    parser.add_argument("--placement", action="store_true", help="64-token pages packed in a cache just large enough, "
                                                                 "or spread at random or in order over --cache-gb")
    parser.add_argument("--cache-gb", type=float, default=4.6, help="with --placement: a layer's cache (W1's engine: 4.6)")
    parser.add_argument("--order", action="store_true", help="unequal contexts (W1's phases) in random order, longest "
                                                             "first, or shortest first; and equal ones of the same total")
    parser.add_argument("--order-launches", default=None, help="with --order: block_n x warps x stages, comma-separated "
                                                               "(e.g. 64x4x2,32x1x2), each gathered, over orders only")
    parser.add_argument("--order-kv-dtype", default="bfloat16", choices=["bfloat16", "fp8"], help="with --order-launches")
    parser.add_argument("--order-heads", type=int, default=HEADS, help="with --order-launches: query heads (8B: 32)")
    parser.add_argument("--order-seqs", default=None, help="with --order-launches: batch sizes (comma-separated) in place of "
                                                           "W1's four phases, each with the middle phase's contexts")
    parser.add_argument("--order-variants", default=None, help="with --order-launches: only these orders (comma-separated: "
                                                               "random, longest first, equal)")
    parser.add_argument("--order-bulk", action="store_true", help="with --order-launches: bulk copies too (longest first, "
                                                                   "and equal contexts)")
    args = parser.parse_args()
    if args.policies:
        return compare_policies(args)
    if args.tma:
        return sweep_tma(args)
    if args.long_bulk:
        return sweep_long_bulk(args)
    if args.placement:
        return sweep_placement(args)
    if args.order:
        return sweep_order(args)
    grid = ((64,), (4,), (2,)) if args.default_config_only else ((32, 64, 128), (4, 8), STAGES)
    if args.long:
        return sweep_long(args)
    results = []
    for num_seqs, context in CASES:
        query, cache, tables, lens = make_case(num_seqs, context)
        read = kv_bytes(num_seqs * context)
        auto = decode_splits(num_seqs, KV_HEADS, query.device)
        for block_n, warps, stages, splits in itertools.product(*grid, sorted({1, auto})):
            def run():
                paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=block_n, num_splits=splits,
                                       num_warps=warps, num_stages=stages)
            try:
                ms = do_bench(run, warmup=10, rep=50)
            except Exception as error:  # noqa: BLE001 - a configuration that does not fit is recorded, not fatal
                results.append({"seqs": num_seqs, "context": context, "block_n": block_n, "warps": warps, "stages": stages,
                                "splits": splits, "error": type(error).__name__})
                continue
            results.append({"seqs": num_seqs, "context": context, "block_n": block_n, "warps": warps, "stages": stages,
                            "splits": splits, **timing(read, ms)})
        best = min((r for r in results if r["seqs"] == num_seqs and "us" in r), key=lambda r: r["us"])
        default = next(r for r in results if r["seqs"] == num_seqs and r.get("block_n") == 64 and r["warps"] == 4
                       and r["stages"] == 2 and r["splits"] == auto)
        unsplit = next(r for r in results if r["seqs"] == num_seqs and r.get("block_n") == 64 and r["warps"] == 4
                       and r["stages"] == 2 and r["splits"] == 1)
        print(f"{num_seqs} x {context}: default {default['us']} us ({default['tb_per_s']} TB/s, {auto} splits), "
              f"unsplit {unsplit['us']} us; best {best}")
    write_json(args.output_json, results)


def sweep_long(args) -> None:
    results = []
    for num_seqs, context in LONG_CASES:
        query, cache, tables, lens = make_case(num_seqs, context)
        read = kv_bytes(num_seqs * context)
        auto = decode_splits(num_seqs, KV_HEADS, query.device)
        for block_n, warps, stages, splits, min_split in itertools.product(
                (64, 128), (4, 8), STAGES, sorted({auto, 16, 32, 64, 128}), (256, 512)):
            row = {"seqs": num_seqs, "context": context, "block_n": block_n, "warps": warps, "stages": stages,
                   "splits": splits, "min_split": min_split}

            def run():
                paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=block_n, num_splits=splits,
                                       min_split_tokens=min_split, num_warps=warps, num_stages=stages)
            try:
                ms = do_bench(run, warmup=10, rep=50)
            except Exception as error:  # noqa: BLE001
                results.append({**row, "error": type(error).__name__})
                continue
            results.append({**row, **timing(read, ms)})
        mine = [r for r in results if r["seqs"] == num_seqs and r["context"] == context and "us" in r]
        default = next(r for r in mine if r["block_n"] == 64 and r["warps"] == 4 and r["stages"] == 2
                       and r["splits"] == auto and r["min_split"] == 512)
        print(f"{num_seqs} x {context}: default {default['us']} us ({default['tb_per_s']} TB/s, {auto} splits); "
              f"best {min(mine, key=lambda r: r['us'])}", flush=True)
    write_json(args.output_json, results)


def sweep_tma(args) -> None:
    """Each case with CUDA-graph timing (the engine replays its decode steps): the old default launch over 16-token
    pages, then over 64-token pages every (gather or bulk copy, warps, stages), with the split count the engine takes."""
    from raygrid.bench.kernel_timing import cuda_graph_ms

    results = []
    for num_seqs, context in CASES + [(1, 32768)]:
        read = kv_bytes(num_seqs * context)
        splits = decode_splits(num_seqs, KV_HEADS, torch.device("cuda"))
        launches = [(16, False, 4, 2)] + list(itertools.product((64,), (False, True), (4, 8), STAGES))
        cases = {page: make_case(num_seqs, context, page) for page in (16, 64)}
        for page, tma, warps, stages in launches:
            query, cache, tables, lens = cases[page]
            row = {"seqs": num_seqs, "context": context, "page": page, "tma": tma, "warps": warps, "stages": stages,
                   "splits": splits}
            try:
                ms = cuda_graph_ms(lambda: paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=64,
                                                                  num_splits=splits, num_warps=warps, num_stages=stages,
                                                                  tma=tma))
            except Exception as error:  # noqa: BLE001 - a launch that does not fit is recorded, not fatal
                results.append({**row, "error": f"{type(error).__name__}: {error}"[:300]})
                continue
            results.append({**row, **timing(read, ms)})
        del cases
        mine = [r for r in results if r["seqs"] == num_seqs and r["context"] == context and "us" in r]
        def best(**match):
            return min((r for r in mine if all(r[k] == v for k, v in match.items())), key=lambda r: r["us"], default=None)
        print(f"{num_seqs} x {context} ({splits} splits): page 16 {best(page=16)['us']} us; page 64 gathered "
              f"{best(page=64, tma=False, warps=4, stages=2)['us']} us (best {best(page=64, tma=False)}); bulk "
              f"{best(page=64, tma=True, warps=4, stages=2)['us']} us (best {best(page=64, tma=True)})", flush=True)
    write_json(args.output_json, results)


def sweep_long_bulk(args) -> None:
    """A few long contexts as the engine runs them on a GPU (64-token pages, tiles by bulk copy, CUDA-graph timing,
    the combine kernel included): the number of slices, as programs an SM (the policy's ``programs_per_sm``), their
    least length and the pipeline's stages."""
    from raygrid.bench.kernel_timing import cuda_graph_ms

    results = []
    for num_seqs, context in [(1, 32768), (1, 8192)]:
        read = kv_bytes(num_seqs * context)
        query, cache, tables, lens = make_case(num_seqs, context, 64)
        auto = decode_splits(num_seqs, KV_HEADS, query.device)
        for per_sm, min_split, stages in itertools.product((1, 2, 3, 4, 6, 8), (128, 256), (2, 3)):
            splits = decode_splits(num_seqs, KV_HEADS, query.device, programs_per_sm=per_sm, max_splits=1024)  # uncapped
            row = {"seqs": num_seqs, "context": context, "page": 64, "tma": True, "programs_per_sm": per_sm,
                   "splits": splits, "min_split": min_split, "stages": stages, "default": splits == auto and min_split == 256
                   and stages == 2}
            try:
                ms = cuda_graph_ms(lambda: paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, block_n=64,
                                                                  num_splits=splits, min_split_tokens=min_split,
                                                                  num_warps=4, num_stages=stages, tma=True))
            except Exception as error:  # noqa: BLE001 - a launch that does not fit is recorded, not fatal
                results.append({**row, "error": f"{type(error).__name__}: {error}"[:300]})
                continue
            results.append({**row, **timing(read, ms)})
        mine = [r for r in results if r["seqs"] == num_seqs and r["context"] == context and "us" in r]
        default = next((r for r in mine if r["default"]), None)
        print(f"{num_seqs} x {context}: default {default}; best {min(mine, key=lambda r: r['us'])}", flush=True)
    write_json(args.output_json, results)


def sweep_placement(args) -> None:
    """Gathered and bulk-copied tiles (64-token pages, the default warps and stages) over three placements of the
    same pages: packed in a cache just large enough, at random over a cache of --cache-gb (as an engine's layer finds
    its sequences' pages), and in order at the start of that cache."""
    from raygrid.bench.kernel_timing import cuda_graph_ms

    page, results = 64, []
    page_bytes = page * KV_HEADS * HEAD_DIM * 2  # one page of keys (values: as many, in the other half)
    big_blocks = int(args.cache_gb * 1e9 / (2 * page_bytes))
    cache = torch.randn(2, big_blocks, page, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    for num_seqs, context in [(256, 530), (128, 1200), (32, 1536), (1, 32768)]:
        read = kv_bytes(num_seqs * context)
        splits = decode_splits(num_seqs, KV_HEADS, torch.device("cuda"))
        per_seq = -(-context // page)
        needed = num_seqs * per_seq
        query = torch.randn(num_seqs, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        lens = torch.full((num_seqs,), context, dtype=torch.int32, device="cuda")
        placements = {
            "packed, random": (cache[:, : needed + 1], 1 + torch.randperm(needed, device="cuda")),
            "spread, random": (cache, 1 + torch.randperm(big_blocks - 1, device="cuda")[:needed]),
            "spread, in order": (cache, 1 + torch.arange(needed, device="cuda")),
        }
        line = []
        for name, (layer_cache, blocks) in placements.items():
            tables = blocks.view(num_seqs, per_seq).int()
            for tma in (False, True):
                ms = cuda_graph_ms(lambda: paged_attention_decode(query, layer_cache, tables, lens, HEAD_DIM**-0.5,
                                                                  block_n=64, num_splits=splits, tma=tma))
                results.append({"seqs": num_seqs, "context": context, "placement": name, "tma": tma, "splits": splits,
                                "cache_gb": round(layer_cache.numel() * 2 / 1e9, 2), **timing(read, ms)})
                line.append(f"{name} {'bulk' if tma else 'gathered'} {results[-1]['us']} us")
        print(f"{num_seqs} x {context} ({splits} splits): " + "; ".join(line), flush=True)
    write_json(args.output_json, results, cache_gb=args.cache_gb)


def sweep_order(args) -> None:
    """Does the order of a batch's sequences matter when their contexts differ? The kernel's programs start in the
    batch's order, so a long context that starts last leaves a tail where few programs run. Contexts as W1's phases
    (prompt uniform in 100-1024, plus the tokens generated so far), 64-token pages, gathered and bulk copied; the same
    batch in random order, longest first and shortest first, a batch of equal contexts of the same total, and the
    random order with contexts sliced (slices of at least a given length, combined by the second kernel)."""
    from raygrid.bench.kernel_timing import cuda_graph_ms

    if args.order_launches:
        return sweep_order_launches(args)
    page, results = 64, []
    for num_seqs, low, high, lens in w1_phases():
        total = int(lens.sum())
        query, cache, tables, _ = make_case(num_seqs, int(lens.max()), page)  # pages for the longest context each
        cases = {name: (case_lens, 1, 64) for name, case_lens in orders(lens).items()}
        for splits, min_split in [(2, 512), (2, 768), (2, 1024), (4, 512)]:  # random order, long contexts sliced
            cases[f"random, {splits} slices of >= {min_split}"] = (lens, splits, min_split)
        line = []
        for name, (case_lens, splits, min_split) in cases.items():
            lens_dev = case_lens.to(torch.int32).cuda()
            for tma in (False, True):
                ms = cuda_graph_ms(lambda: paged_attention_decode(query, cache, tables, lens_dev, HEAD_DIM**-0.5,
                                                                  block_n=64, num_splits=splits, min_split_tokens=min_split,
                                                                  tma=tma))
                read = kv_bytes(int(case_lens.sum()))
                results.append({"seqs": num_seqs, "generated": [low, high], "mean_context": round(total / num_seqs),
                                "max_context": int(lens.max()), "order": name, "splits": splits,
                                "min_split_tokens": min_split, "tma": tma, **timing(read, ms)})
                line.append(f"{name} {'bulk' if tma else 'gathered'} {results[-1]['us']} us")
        print(f"{num_seqs} seqs, mean context {total // num_seqs}, max {int(lens.max())}: " + "; ".join(line), flush=True)
    write_json(args.output_json, results)


def w1_phases(sizes: list[int] | None = None):
    """Batches as W1's phases: (sequences, generated low, high, contexts), each prompt uniform in 100-1024 plus the
    tokens generated so far, from one seed. ``sizes``: batches of those sizes instead, each with the middle phase's
    generated tokens (200 to 1,000)."""
    gen = torch.Generator().manual_seed(0)
    phases = [(n, 200, 1000) for n in sizes] if sizes else [(256, 0, 100), (192, 0, 600), (128, 200, 1000), (64, 400, 1000)]
    for num_seqs, low, high in phases:
        yield num_seqs, low, high, torch.randint(100, 1025, (num_seqs,), generator=gen) + \
            torch.randint(low, high + 1, (num_seqs,), generator=gen)


def orders(lens: torch.Tensor) -> dict:
    """The batch's contexts in random order, longest first, shortest first, and equal ones of the same total."""
    cases = {"random": lens, "longest first": lens[lens.argsort(descending=True)], "shortest first": lens[lens.argsort()]}
    cases["equal"] = torch.full_like(lens, int(lens.sum()) // lens.numel())
    return cases


def sweep_order_launches(args) -> None:
    """W1's phases under each of --order-launches, gathered, over a bf16 or an FP8 cache: in the batch's order, longest
    first (the kernel's ``order``: the batch stays as it is), and equal contexts of the same total. Whether a launch
    that wins over equal contexts keeps its lead over W1's unequal ones, and what starting the longest programs first
    recovers; with --order-bulk, whether bulk copies win then. (At d47a2ee the kernel's grid could also run sequences
    fastest: results/decode_order_h200/.)"""
    from raygrid.bench.kernel_timing import cuda_graph_ms

    launches = [tuple(int(x) for x in launch.split("x")) for launch in args.order_launches.split(",")]
    fp8 = args.order_kv_dtype == "fp8"
    page, results = 64, []
    sizes = [int(n) for n in args.order_seqs.split(",")] if args.order_seqs else None
    for num_seqs, low, high, lens in w1_phases(sizes):
        query, cache, tables, _ = make_case(num_seqs, int(lens.max()), page, heads=args.order_heads)
        if fp8:
            cache = cache.to(torch.float8_e4m3fn)
        cases = orders(lens)
        random_lens, equal_lens = (cases[name].to(torch.int32).cuda() for name in ("random", "equal"))
        longest_first = torch.argsort(random_lens, descending=True).int()
        variants = {"random": (random_lens, None, False), "longest first": (random_lens, longest_first, False),
                    "equal": (equal_lens, None, False)}
        if args.order_bulk:
            variants |= {"longest first, bulk": (random_lens, longest_first, True), "equal, bulk": (equal_lens, None, True)}
        if args.order_variants:
            variants = {name: variants[name] for name in args.order_variants.split(",")}
        line = []
        for block_n, warps, stages in launches:
            for name, (case_lens, order, tma) in variants.items():
                ms = cuda_graph_ms(lambda: paged_attention_decode(query, cache, tables, case_lens, HEAD_DIM**-0.5, block_n=block_n,
                                                                  num_splits=1, num_warps=warps, num_stages=stages, tma=tma,
                                                                  order=order))
                read = kv_bytes(int(case_lens.sum()), cache.element_size())
                results.append({"seqs": num_seqs, "generated": [low, high], "max_context": int(lens.max()), "variant": name,
                                "kv_dtype": args.order_kv_dtype, "heads": args.order_heads, "block_n": block_n,
                                "warps": warps, "stages": stages, **timing(read, ms)})
                line.append(f"{block_n}x{warps}x{stages} {name} {results[-1]['us']} us")
        print(f"{num_seqs} seqs, mean context {int(lens.sum()) // num_seqs}, max {int(lens.max())}:\n  " + "\n  ".join(line), flush=True)
    write_json(args.output_json, results)


def compare_policies(args) -> None:
    """Each case under the split policy before this one, the current one and two neighbours of it, timed three
    times in turn; the lowest total of medians over the cases that split wins."""
    from raygrid.kernels.triton_attention import DECODE_SPLIT_POLICY

    candidates = {"before": dict(programs_per_sm=1, max_splits=16, min_split_tokens=512), "current": dict(DECODE_SPLIT_POLICY),
                  "3/SM, min 512": dict(programs_per_sm=3, max_splits=64, min_split_tokens=512),
                  "2/SM, min 256": dict(programs_per_sm=2, max_splits=32, min_split_tokens=256)}
    results = []
    totals = dict.fromkeys(candidates, 0.0)
    for num_seqs, context in CASES + LONG_CASES[:-1]:  # the last long case is one of CASES
        query, cache, tables, lens = make_case(num_seqs, context)
        read = kv_bytes(num_seqs * context)
        times = {name: [] for name in candidates}
        for _ in range(3):
            for name, policy in candidates.items():
                splits = decode_splits(num_seqs, KV_HEADS, query.device, programs_per_sm=policy["programs_per_sm"],
                                       max_splits=policy["max_splits"])
                ms = do_bench(lambda: paged_attention_decode(query, cache, tables, lens, HEAD_DIM**-0.5, num_splits=splits,
                                                             min_split_tokens=policy["min_split_tokens"]), warmup=10, rep=100)
                times[name].append(ms * 1e3)
                results.append({"seqs": num_seqs, "context": context, "policy": name, **policy, "splits": splits,
                                **timing(read, ms)})
        medians = {name: sorted(t)[1] for name, t in times.items()}
        if num_seqs * KV_HEADS < 132:
            for name in candidates:
                totals[name] += medians[name]
        print(f"{num_seqs} x {context}: " + ", ".join(f"{name} {us:.1f} us" for name, us in medians.items()), flush=True)
    best = min(totals, key=totals.get)
    print("total of medians over the split cases: " + ", ".join(f"{n} {t:.1f} us" for n, t in totals.items()) + f"; best: {best}")
    write_json(args.output_json, results, candidates=candidates, totals_us=totals, best=best, best_policy=candidates[best])

def write_json(path: str | None, results: list, **extra) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**provenance(), **extra, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
