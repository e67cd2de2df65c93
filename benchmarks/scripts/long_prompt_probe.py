"""Why a 32k prompt's TTFT differs between `raygrid bench latency` (284 ms at 8,192 tokens a step) and
profile_prefill.py (347 ms, same budget) or a 16,384-token budget (339 ms). For each setting: TTFT of fresh prompts,
the device kernels of one prefill under torch's profiler, and the greedy top-5 logprobs of one fixed prompt, so
the settings can be compared for both time and result. (The answer, found with prefill_modes.py: a race in the
staged inputs corrupted the fast runs; fixed at 409081d, benchmarks/README.md.)

    python benchmarks/scripts/long_prompt_probe.py OUT.json [--prompt-len 32768]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--prompt-len", type=int, default=32768)
    parser.add_argument("--settings", default="0,1,2,3", help="which settings to run, by index")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import LLM, SamplingParams
    from raygrid.bench.latency import _Prompts, time_raygrid
    from raygrid.bench.profile_decode import device_busy_us, device_kernels, kernel_ms_by_step
    from raygrid.bench.throughput import provenance
    from raygrid.engine.arg_utils import EngineArgs
    from raygrid.engine.llm_engine import LLMEngine
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    path = resolve_model_path(args.model)
    layers = load_hf_config(path).num_hidden_layers
    fixed = np.random.default_rng(123).integers(0, 10000, args.prompt_len).tolist()
    settings = [
        ("engine, max_model_len = prompt + 128, budget 8192", "engine", dict(max_model_len=args.prompt_len + 128, max_num_batched_tokens=8192)),
        ("engine, max_model_len = prompt + 128, budget 16384", "engine", dict(max_model_len=args.prompt_len + 128, max_num_batched_tokens=16384)),
        ("engine, default max_model_len, budget 8192", "engine", dict(max_num_batched_tokens=8192)),
        ("LLM, default max_model_len, budget 8192", "llm", dict(max_num_batched_tokens=8192)),
        ("engine, max_model_len = prompt + 128, budget 8192, one output token", "engine1",
         dict(max_model_len=args.prompt_len + 128, max_num_batched_tokens=8192)),
        ("engine, max_model_len = prompt + 128, budget = prompt", "engine",
         dict(max_model_len=args.prompt_len + 128, max_num_batched_tokens=args.prompt_len)),
    ]
    rows = []
    for index in (int(i) for i in args.settings.split(",")):
        label, api, kwargs = settings[index]
        output_len = 1 if api == "engine1" else 2
        if api.startswith("engine"):
            engine = LLMEngine.from_engine_args(EngineArgs(model=path, dtype="bfloat16", **kwargs))
            close = engine.shutdown
        else:
            llm = LLM(model=path, dtype="bfloat16", **kwargs)
            engine, close = llm.llm_engine, llm.shutdown
        prompts = _Prompts(0, 10000)
        time_raygrid(engine, prompts.batch(1, args.prompt_len), output_len)  # warm-up
        ttfts = [time_raygrid(engine, prompts.batch(1, args.prompt_len), output_len).prefilled_s * 1e3 for _ in range(3)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            time_raygrid(engine, prompts.batch(1, args.prompt_len), output_len)
            torch.cuda.synchronize()
        kernels = device_kernels(prof, 1)
        per_step_ms = kernel_ms_by_step(prof, "_prefill_kernel", layers)
        rid = engine.next_request_id()
        engine.add_request(rid, {"prompt_token_ids": fixed}, SamplingParams(temperature=0.0, max_tokens=2, logprobs=5))
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    final = out
        completion = final.outputs[0]
        top = [{str(t): round(lp.logprob, 4) for t, lp in step.items()} for step in completion.logprobs]
        row = {"setting": label, "ttft_ms": [round(t, 1) for t in ttfts], "gpu_busy_ms": round(device_busy_us(prof) / 1e3, 1),
               "top_kernels": kernels[:8], "prefill_kernel_ms_by_step": per_step_ms, "greedy_tokens": list(completion.token_ids), "top5_logprobs": top,
               "max_num_batched_tokens": engine.config.scheduler.max_num_batched_tokens}
        rows.append(row)
        print(f"{label}: TTFT {row['ttft_ms']} ms, GPU busy {row['gpu_busy_ms']} ms, attention by step {per_step_ms} ms, "
              f"tokens {row['greedy_tokens']}, "
              f"top5 {top[0]}", flush=True)
        for k in kernels[:5]:
            print(f"    {k['us_per_step'] / 1e3:8.2f} ms ({k['own_us_per_step'] / 1e3:8.2f} own) x{k['calls_per_step']:5.0f} "
                  f"{k['name'][:80]}", flush=True)
        close()
        time.sleep(1)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({**provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
