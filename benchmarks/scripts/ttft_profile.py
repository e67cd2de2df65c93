"""Where a request's time to first token goes, on one GPU.

    python3 benchmarks/scripts/ttft_profile.py OUT_DIR [--input-len 512] [--model random-qwen3-0.6b] [--variants ...] [--no-trace]

For each engine variant (default; async scheduling off; eager; both off; a step budget of 16k or 32k tokens, so
that a long prompt is prefilled in fewer chunks), after warm-up runs, a few fresh prompts
run alone and every ``engine.step()`` is timed: which step returns the first token, and how long each
step took. Then one more request runs under cProfile and one under torch.profiler (host and device).
Writes OUT_DIR/ttft_profile.json, OUT_DIR/cprofile_<variant>.txt, OUT_DIR/torch_<variant>.txt and, without
--no-trace, OUT_DIR/trace_<variant>.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import numpy as np

from raygrid.bench.throughput import provenance


def run_one(engine, prompt, output_len):
    from raygrid import SamplingParams

    params = SamplingParams(temperature=1.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    rid = engine.next_request_id()
    start = time.perf_counter()
    engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    added = time.perf_counter()
    steps, first_step = [], None
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        outs = engine.step()
        t1 = time.perf_counter()
        steps.append(t1 - t0)
        if first_step is None and any(o.outputs and o.outputs[0].token_ids for o in outs):
            first_step = len(steps) - 1
            ttft = t1 - start
    return {"ttft_ms": ttft * 1e3, "add_ms": (added - start) * 1e3, "first_token_step": first_step,
            "first_steps_ms": [s * 1e3 for s in steps[:6]], "median_step_ms": float(np.median(steps[3:]) * 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--variants", nargs="+", default=["default", "sync", "eager"])
    parser.add_argument("--no-trace", action="store_true", help="skip the Chrome traces (large for long prompts)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from raygrid.engine.arg_utils import EngineArgs
    from raygrid.engine.llm_engine import LLMEngine

    variant_kwargs = {"default": {}, "sync": {"async_scheduling": False}, "eager": {"enforce_eager": True},
                      "sync_eager": {"async_scheduling": False, "enforce_eager": True},
                      "budget16k": {"max_num_batched_tokens": 16384}, "budget32k": {"max_num_batched_tokens": 32768}}
    rng = np.random.default_rng(0)
    report = {**provenance(), "variants": {}}
    for name in args.variants:
        engine = LLMEngine.from_engine_args(EngineArgs(model=args.model, dtype="bfloat16", max_model_len=args.input_len + 512,
                                                       **variant_kwargs[name]))
        high = min(10000, engine.processor.vocab_size)
        prompt = lambda: rng.integers(0, high, size=args.input_len).tolist()  # noqa: E731
        for _ in range(3):
            run_one(engine, prompt(), args.output_len)
        runs = [run_one(engine, prompt(), args.output_len) for _ in range(5)]
        profiler = cProfile.Profile()
        profiler.enable()
        run_one(engine, prompt(), 4)
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        (out / f"cprofile_{name}.txt").write_text(text.getvalue())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            run_one(engine, prompt(), 4)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
        table += "\n\n" + prof.key_averages().table(sort_by="self_device_time_total", row_limit=30)
        (out / f"torch_{name}.txt").write_text(table)
        if not args.no_trace:
            prof.export_chrome_trace(str(out / f"trace_{name}.json"))
        report["variants"][name] = {"runs": runs, "ttft_median_ms": float(np.median([r["ttft_ms"] for r in runs]))}
        print(name, json.dumps(report["variants"][name]["ttft_median_ms"]), runs[0], flush=True)
        engine.shutdown()
        torch.cuda.empty_cache()
    (out / "ttft_profile.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
