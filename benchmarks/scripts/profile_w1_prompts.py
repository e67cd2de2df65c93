"""Where W1's steps with prompt tokens go (issue #21): they take 25 to 40 ms each from run to run, while one step of
8,192 fresh prompt tokens alone is 15 ms of GPU work (profile_prefill.py). Runs W1 (``raygrid bench throughput``'s
workload) three times on one engine: the first warms it, the second is timed step by step, the third runs its first
``--steps`` steps under torch's profiler and the rest plain. Writes, for the timed and profiled runs:

- each of the first steps: ms since the previous step finished, tokens, requests, and the host time the profiler saw;
- the device kernels of the profiled steps and the host calls with the most self time (allocations, syncs, ...),
  for the first ``--steps`` steps and for ten decode steps from ``--decode-at`` on (W1's real mix of contexts);
- the caching allocator's counters over each run (a retry frees every cached block and synchronizes).

    python benchmarks/scripts/profile_w1_prompts.py OUT.json [--model random-qwen3-0.6b] [--steps 24]
        [--quantization fp8 --kv-cache-dtype fp8]
"""

from __future__ import annotations

import argparse
import json
import time

ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams", "num_ooms")


def allocator_counters() -> dict[str, int]:
    import torch

    stats = torch.cuda.memory_stats() if torch.cuda.is_available() else {}
    return {key: int(stats.get(key, 0)) for key in ALLOCATOR_COUNTERS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default=None, help="fp8: FP8 weights")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--steps", type=int, default=24, help="steps profiled at the start of the third run")
    parser.add_argument("--decode-at", type=int, default=300, help="and ten decode steps from this one on")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import LLM, SamplingParams
    from raygrid.bench.profile_decode import device_kernels
    from raygrid.bench.throughput import make_workload, provenance
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    model_path = resolve_model_path(args.model)
    prompts, output_lens = make_workload(args.num_prompts, None, None, (100, 1024), 0, load_hf_config(model_path).vocab_size)
    longest = max(len(p) + n for p, n in zip(prompts, output_lens))
    llm = LLM(model=model_path, dtype=args.dtype, max_model_len=max(longest, 2048), quantization=args.quantization,
              kv_cache_dtype=args.kv_cache_dtype)
    engine, core = llm.llm_engine, llm.engine
    params = [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True, detokenize=False) for n in output_lens]

    def run(label: str, profiled_steps: int = 0) -> dict:
        assert llm.reset_prefix_cache(), "the prefix cache must be empty: each run prefills its prompts again"
        core.step_trace = []
        before = allocator_counters()
        start = time.perf_counter()
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request(f"{label}-{i}", {"prompt_token_ids": prompt}, p)
        added = time.perf_counter()
        windows = [(0, profiled_steps), (args.decode_at, args.decode_at + 10)] if profiled_steps else []
        profiles, prof, steps = [], None, 0
        while engine.has_unfinished_requests():
            if any(steps == lo for lo, _ in windows):
                prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
                prof.__enter__()
            engine.step(emit_unfinished=False)
            steps += 1
            if prof is not None and any(steps == hi for _, hi in windows):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                prof.__exit__(None, None, None)
                profiles.append(prof)
                prof = None
        elapsed = time.perf_counter() - start
        trace, core.step_trace = core.step_trace, None
        first, previous = [], added
        for finished, tokens, reqs in trace[: max(profiled_steps, args.steps)]:
            first.append({"ms": round(1e3 * (finished - previous), 2), "tokens": tokens, "requests": reqs})
            previous = finished
        result = {"elapsed_s": round(elapsed, 3), "output_tok_s": round(sum(output_lens) / elapsed, 1),
                  "adding_requests_ms": round(1e3 * (added - start), 1), "steps": len(trace), "first_steps": first,
                  "prompt_steps_s": round(sum(s["ms"] for s in first if s["tokens"] > s["requests"]) / 1e3, 3),
                  "allocator": {k: v - before[k] for k, v in allocator_counters().items()}}
        for name, prof, (lo, hi) in zip(("prompt_steps", "decode_steps"), profiles, windows):
            host = [{"name": e.key[:100], "calls": e.count, "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2)}
                    for e in prof.key_averages() if e.self_cpu_time_total > 0]
            result[name] = {"steps": [lo, hi], "trace": [(round(1e3 * (b[0] - a[0]), 2), b[1], b[2]) for a, b in zip(trace[lo:hi], trace[lo + 1:hi + 1])],
                            "kernels": device_kernels(prof, hi - lo)[:25],
                            "host_calls": sorted(host, key=lambda h: -h["self_cpu_ms"])[:30]}
        print(f"{label}: {result['output_tok_s']} output tok/s, prompt steps {result['prompt_steps_s']} s, "
              f"adding {result['adding_requests_ms']} ms, allocator {result['allocator']}")
        print("   ", [(s["ms"], s["tokens"], s["requests"]) for s in first])
        return result

    runs = {"warm": run("warm"), "timed": run("timed"), "profiled": run("profiled", args.steps)}
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({"model": args.model, "runs": runs, **provenance()}, f, indent=2)
    for h in runs["profiled"]["prompt_steps"]["host_calls"][:15]:
        print(f"  {h['self_cpu_ms']:9.2f} ms  x{h['calls']:6d}  {h['name']}")
    llm.shutdown()


if __name__ == "__main__":
    main()
