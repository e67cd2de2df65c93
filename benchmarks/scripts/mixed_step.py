"""The decode step with prefill beside it (issue #11's "TPOT median with 256 in flight is at most 1.3x the
offline decode step"). Two phases on one engine, offline:

- ``decode``: ``--running`` requests decoding, no prefill (the step the target divides by);
- ``steady``: ``--running`` requests kept in flight. They start with staggered lengths, so about
  running / output_len finish each step, and each one that finishes is replaced at once by a fresh prompt
  of ``--prompt-len`` tokens: every step carries that prefill beside the decodes, as in online serving.

Each phase is timed (wall per step, the step loop's CPU time, and the host time of launching the step),
then profiled (GPU busy per step, kernels slowest first, host operations by CPU time in ``OUT_<phase>_cpu.txt``).

    python benchmarks/scripts/mixed_step.py OUT.json [--model random-qwen3-0.6b] [--running 256]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--running", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--profile-steps", type=int, default=20)
    parser.add_argument("--phases", default="decode,steady")
    parser.add_argument("--trace", action="store_true", help="also write each phase's profile as a Chrome trace")
    parser.add_argument("--cprofile", action="store_true", help="also run --profile-steps steps under cProfile (OUT_<phase>_cprofile.txt)")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import LLM, SamplingParams
    from raygrid.bench.profile_decode import device_busy_us, device_kernels
    from raygrid.bench.throughput import device_name, git_commit

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    llm = LLM(model=args.model, dtype=args.dtype)
    core = llm.engine
    rng = np.random.default_rng(0)
    counter = iter(range(10**9))
    launch_seconds: list[float] = []
    launch = core.executor.execute_model_async

    def timed_launch(so):
        start = time.perf_counter()
        try:
            return launch(so)
        finally:
            launch_seconds.append(time.perf_counter() - start)

    core.executor.execute_model_async = timed_launch

    def add(max_tokens: int) -> None:
        params = SamplingParams(temperature=0.6, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        prompt = rng.integers(0, min(10000, llm.processor.vocab_size), args.prompt_len).tolist()  # the prefix cache never hits
        for child in llm.processor.process(f"m{next(counter)}", {"prompt_token_ids": prompt}, params).children:
            core.add_request(child)

    def run(steps: int, refill: bool) -> list[tuple[float, float, int]]:
        """``steps`` steps: (wall, thread CPU, tokens scheduled) each; with ``refill`` a finished request is replaced."""
        out = []
        for _ in range(steps):
            wall, cpu = time.perf_counter(), time.thread_time()
            finished = sum(o.finished for o in core.step())
            out.append((time.perf_counter() - wall, time.thread_time() - cpu, core.step_trace[-1][1] if core.step_trace else 0))
            for _ in range(finished if refill else 0):
                add(args.output_len)
        return out

    runner = core.executor.worker.runner

    def replays() -> tuple[int, int]:
        """Passes replayed so far by the mixed full graphs and by the piecewise graphs."""
        return (runner.graphs.num_mixed_replays if runner.graphs else 0, runner.piecewise.num_replays if runner.piecewise else 0)

    def measure(name: str, refill: bool) -> dict:
        core.step_trace = []
        launch_seconds.clear()
        before = replays()
        rows = run(args.steps, refill)
        mixed_replays, piecewise_replays = (after - start for after, start in zip(replays(), before))
        launches = list(launch_seconds)
        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(args.profile_steps, refill)
            sync()
        kernels = device_kernels(prof, args.profile_steps)
        with open(f"{args.output.removesuffix('.json')}_{name}_cpu.txt", "w", encoding="utf-8") as f:
            f.write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60))
        if args.trace:
            prof.export_chrome_trace(f"{args.output.removesuffix('.json')}_{name}_trace.json")
        if args.cprofile:
            profiler = cProfile.Profile()
            profiler.runcall(run, args.profile_steps, refill)
            with open(f"{args.output.removesuffix('.json')}_{name}_cprofile.txt", "w", encoding="utf-8") as f:
                pstats.Stats(profiler, stream=f).sort_stats("tottime").print_stats(40)
        walls, cpus, tokens = (np.array(c, dtype=float) for c in zip(*rows))
        result = {
            "phase": name,
            "wall_ms_median": float(np.median(walls)) * 1e3,
            "wall_ms_mean": float(walls.mean()) * 1e3,
            "step_cpu_ms_median": float(np.median(cpus)) * 1e3,
            "launch_ms_median": float(np.median(launches)) * 1e3,
            "scheduled_tokens_median": float(np.median(tokens)),
            "steps": args.steps,
            "mixed_graph_replays": mixed_replays,
            "piecewise_replays": piecewise_replays,
            "gpu_busy_ms_per_step": device_busy_us(prof) / args.profile_steps / 1e3,
            "top_kernels": kernels[:25],
        }
        print(f"{name}: wall {result['wall_ms_median']:.2f} ms (mean {result['wall_ms_mean']:.2f}), step CPU "
              f"{result['step_cpu_ms_median']:.2f} ms, launch {result['launch_ms_median']:.2f} ms, GPU busy "
              f"{result['gpu_busy_ms_per_step']:.2f} ms, {result['scheduled_tokens_median']:.0f} tokens a step; of "
              f"{args.steps} steps {mixed_replays} replayed a mixed graph, {piecewise_replays} the pieces")
        for k in kernels[:12]:
            print(f"  {k['us_per_step']:9.1f} us ({k['own_us_per_step']:9.1f} own)  x{k['calls_per_step']:5.1f}  {k['name']}")
        return result

    results = []
    phases = args.phases.split(",")
    if "decode" in phases:
        for _ in range(args.running):
            add(args.steps + args.profile_steps + 64)
        while core.stats().num_waiting or core.stats().num_running < args.running:  # every prefill done
            core.step()
        run(3, refill=False)
        results.append(measure("decode", refill=False))
        core.abort_requests(list(core.scheduler.requests))
        while core.has_unfinished_requests():
            core.step()
    if "steady" in phases:
        for i in range(args.running):  # staggered: about running / output_len finish each step
            add(1 + (i * args.output_len) // args.running)
        run(2 * args.output_len, refill=True)  # until the staggered start has turned over
        results.append(measure("steady", refill=True))
    summary = {"model": args.model, "running": args.running, "prompt_len": args.prompt_len, "output_len": args.output_len,
               "phases": results, "device": device_name(), "git_commit": git_commit(), "date": time.strftime("%Y-%m-%d")}
    if len(results) == 2:
        summary["steady_over_decode"] = results[1]["wall_ms_median"] / results[0]["wall_ms_median"]
        print(f"steady / decode: {summary['steady_over_decode']:.2f}x")
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    llm.shutdown()


if __name__ == "__main__":
    main()
