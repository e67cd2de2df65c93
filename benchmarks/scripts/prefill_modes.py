"""Two puzzles of a 32k prompt's prefill (benchmarks/README.md), in one process.

1. The kernel alone: the four chunks of a 32k prompt (8,192 queries each after 0 to 24,576 cached tokens) over a
   cache as large as an engine's layer, with the sequence's pages consecutive from several first blocks. Does
   where the pages sit change the kernel's time?
2. The engine: requests of one and of two output tokens alternating on one engine, each profiled: TTFT, the
   attention kernels' time by step, and the request's first block.

Part 2 found the cause: a race in the staged inputs, fixed at 409081d (benchmarks/README.md).

    python benchmarks/scripts/prefill_modes.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def kernel_part(num_blocks: int, offsets: list[int]) -> list[dict]:
    import torch
    from triton.testing import do_bench

    from raygrid.kernels.triton_attention import paged_attention_prefill

    heads, kv_heads, dim, page, length, chunk = 16, 8, 128, 16, 32768, 8192
    cache = torch.randn(2, num_blocks, page, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(chunk, heads, dim, dtype=torch.bfloat16, device="cuda")
    starts = torch.tensor([0, chunk], dtype=torch.int32, device="cuda")
    rows = []
    for first in offsets:
        table = torch.arange(first, first + length // page, dtype=torch.int32, device="cuda")[None, :]
        calls = [(torch.tensor([prefix + chunk], dtype=torch.int32, device="cuda")) for prefix in range(0, length, chunk)]

        def four_chunks():
            for lens in calls:
                paged_attention_prefill(q, cache, table, lens, starts, dim**-0.5)

        ms = do_bench(four_chunks, warmup=3, rep=60)
        rows.append({"first_block": first, "four_chunks_ms": round(ms, 3)})
        print(f"kernel: pages from block {first}: four chunks {ms:.3f} ms", flush=True)
    return rows


def engine_part(model: str, runs: int, prompt_len: int = 32768, budget: int = 8192) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import SamplingParams
    from raygrid.bench.profile_decode import kernel_ms_by_step
    from raygrid.engine.arg_utils import EngineArgs
    from raygrid.engine.llm_engine import LLMEngine
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    path = resolve_model_path(model)
    layers = load_hf_config(path).num_hidden_layers
    on_gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    engine = LLMEngine.from_engine_args(EngineArgs(model=path, dtype="bfloat16" if on_gpu else "float32", device="auto" if on_gpu else "cpu",
                                                   max_model_len=prompt_len + 128, max_num_batched_tokens=budget))
    scheduler = getattr(engine.engine, "scheduler", None)  # an engine in this process
    rng = np.random.default_rng(0)
    rows = []
    for i in range(runs):
        max_tokens = 2 if i % 2 == 0 else 1
        prompt = rng.integers(0, 1000, prompt_len).tolist()
        params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        sync()
        first_block = None
        with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
            rid = engine.next_request_id()
            start = time.perf_counter()
            engine.add_request(rid, {"prompt_token_ids": prompt}, params)
            ttft = None
            while engine.has_unfinished_requests():
                outs = engine.step()
                if first_block is None and scheduler is not None:
                    first_block = scheduler.kv.block_ids(rid)[0]
                for out in outs:
                    if ttft is None and out.outputs and out.outputs[0].token_ids:
                        ttft = time.perf_counter() - start
            sync()
            end = time.perf_counter() - start
        by_step = kernel_ms_by_step(prof, "_prefill_kernel", layers)
        row = {"run": i, "max_tokens": max_tokens, "ttft_ms": round(ttft * 1e3, 1), "end_ms": round(end * 1e3, 1),
               "first_block": first_block, "attention_ms_by_step": by_step, "attention_ms": round(sum(by_step), 1)}
        rows.append(row)
        print("engine:", row, flush=True)
    engine.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-blocks", type=int, default=55000, help="the layer cache's blocks (an engine's on an H200: about 55,000)")
    parser.add_argument("--runs", type=int, default=8)
    args = parser.parse_args()
    from raygrid.bench.throughput import provenance

    kernel = kernel_part(args.num_blocks, [1, 2, 17, 2049, 4097, 8193, 8197, 20000, 40001])
    __import__("torch").cuda.empty_cache()  # the test cache goes back before the engine sizes its own
    engine = engine_part(args.model, args.runs)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({**provenance(), "kernel": kernel, "engine": engine}, f, indent=1)


if __name__ == "__main__":
    main()
