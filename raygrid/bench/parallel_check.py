"""`raygrid bench parallel`: the same greedy requests under several TP x PP layouts; checks that each
layout matches the first (tokens, and the logprobs of the first output position), and times them.

    raygrid bench parallel --model random-qwen3-0.6b --layouts 1x1 2x1 1x2 2x1:eager --num-prompts 32 --max-tokens 32

A layout is TPxPP, with ``:eager`` for no CUDA graphs (so graphs and eager compare under the same layout).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

from raygrid.bench.throughput import device_name, make_workload


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layouts", nargs="+", default=["1x1", "2x1", "1x2"], help="TPxPP[:eager], e.g. 2x1 for TP=2")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--logprobs", type=int, default=5)
    parser.add_argument("--output-json", default=None)


def parse_layout(layout: str) -> tuple[int, int, bool]:
    """'2x1' -> (tp 2, pp 1, graphs allowed); '2x1:eager' -> (2, 1, eager)."""
    shape, _, mode = layout.partition(":")
    if mode not in ("", "eager"):
        raise ValueError(f"layout {layout!r}: the only mode is ':eager'")
    tp, pp = (int(x) for x in shape.split("x"))
    return tp, pp, mode == "eager"


def run_layout(engine_kwargs: dict, layout: str, prompts, max_tokens: int, logprobs: int) -> dict:
    from raygrid import LLM, SamplingParams

    tp, pp, eager = parse_layout(layout)
    backend = "ray" if tp * pp > 1 else "inprocess"
    kwargs = dict(engine_kwargs, enforce_eager=True) if eager else engine_kwargs
    llm = LLM(**kwargs, tensor_parallel_size=tp, pipeline_parallel_size=pp, distributed_executor_backend=backend)
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs, detokenize=False)
        llm.generate([{"prompt_token_ids": p[:8]} for p in prompts[:2]], params, use_tqdm=False)  # warm up
        before = llm.engine.step_timing()[0]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        return {
            "tokens": [o.outputs[0].token_ids for o in outputs],
            "first_logprobs": [{t: lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outputs],
            "elapsed_s": elapsed,
            "step_timing": [timing_since(before, llm.engine.step_timing()[0])],
            "devices": worker_reports(llm, "device_report"),
        }
    finally:
        llm.shutdown()
        del llm


def worker_reports(llm, method: str) -> list:
    """``method`` of every worker (Ray: of each replica's workers, in rank order)."""
    from raygrid.engine.core import EngineCore

    if isinstance(llm.engine, EngineCore):
        return [llm.engine.executor.collective_rpc(method)]
    return llm.engine.collective_rpc(method)


def timing_since(before: dict, after: dict) -> dict:
    """Mean step times of the steps between two step_timing readings (the warm-up left out)."""
    steps = after["num_steps"] - before["num_steps"]
    total = lambda t, key: t[key] * t["num_steps"]
    return {
        "num_steps": steps,
        "engine_step_s": (total(after, "engine_step_s") - total(before, "engine_step_s")) / max(steps, 1),
        "worker_execute_s": (total(after, "worker_execute_s") - total(before, "worker_execute_s")) / max(steps, 1),
        "max_batches_in_flight": after["max_batches_in_flight"],
    }


def compare(reference: dict, other: dict) -> dict:
    prefixes = []
    for a, b in zip(reference["tokens"], other["tokens"]):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefixes.append(n)
    diffs = [abs(lp - ref[t]) for ref, got in zip(reference["first_logprobs"], other["first_logprobs"]) for t, lp in got.items() if t in ref]
    return {
        "identical_requests": sum(a == b for a, b in zip(reference["tokens"], other["tokens"])),
        "min_matching_prefix": min(prefixes),
        "mean_matching_prefix": sum(prefixes) / len(prefixes),
        "first_token_identical": sum(a[0] == b[0] for a, b in zip(reference["tokens"], other["tokens"])),
        "max_first_logprob_diff": max(diffs) if diffs else None,
    }


def run_parallel_check(args: argparse.Namespace, engine_kwargs: dict) -> dict:
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    model_path = resolve_model_path(engine_kwargs["model"])
    # The model keeps its name: a built-in of config and tokenizer only loads dummy weights by name.
    engine_kwargs = dict(engine_kwargs, max_model_len=engine_kwargs.get("max_model_len") or args.input_len + args.max_tokens + 16)
    prompts, _ = make_workload(args.num_prompts, args.input_len, args.max_tokens, None, args.seed, load_hf_config(model_path).vocab_size)
    results = {}
    for layout in args.layouts:
        results[layout] = run_layout(engine_kwargs, layout, prompts, args.max_tokens, args.logprobs)
        timing = results[layout]["step_timing"][0]
        print(f"{layout}: {results[layout]['elapsed_s']:.2f} s, {timing['num_steps']} steps, engine step {timing['engine_step_s'] * 1e3:.2f} ms, "
              f"worker execute {timing['worker_execute_s'] * 1e3:.2f} ms", flush=True)
    reference = args.layouts[0]
    report = {
        "model": model_path,
        "machine": device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["raygrid"] + sys.argv[1:]),
        "layouts": {k: {"elapsed_s": v["elapsed_s"], "step_timing": v["step_timing"], "devices": v["devices"]} for k, v in results.items()},
        "against_" + reference: {k: compare(results[reference], v) for k, v in results.items() if k != reference},
    }
    for layout, comparison in report["against_" + reference].items():
        print(f"{layout} vs {reference}: {comparison}")
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report
