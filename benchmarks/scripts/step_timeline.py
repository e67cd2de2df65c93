"""Where a lone request's decode step goes, host or GPU (GPU only): the engine's host phases, timed with
``perf_counter`` around its methods, and each step's start and end on the GPU, from CUDA events aligned to the host
clock at an idle GPU. Also each thread's share of a CPU over the run (a spinning thread would show).

    python benchmarks/scripts/step_timeline.py OUT_DIR --context 512 --settings off,on [--tag NAME]

``--sampling-params JSON``: more SamplingParams fields for the request (``bench throughput``'s option).
``--settings``: ``off`` (the layer-by-layer pass, CUDA graphs) and ``on`` (``--persistent-decode``), each in an engine
of its own, two timed runs of 200 tokens each. Writes ``OUT_DIR/step_timeline_CONTEXT[TAG].json``; medians a run:

- ``launch_host_ms``: the host's time to launch a step (``ModelRunner._execute``: inputs, forward, sampling);
- ``gpu_step_ms``: from the GPU reaching a step's first event to its last;
- ``queue_lead_ms``: how long a step waited on the GPU after the host launched it (near 0: the GPU waits for the host);
- ``gpu_idle_between_ms``: the GPU idle between steps;
- ``phases_ms``: the host's time in the engine's parts (scheduling, the runner's state, inputs, sampling, outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from raygrid.bench.latency import time_raygrid
from raygrid.bench.throughput import add_sampling_params_arg
from raygrid.engine import core, llm_engine, model_runner, output_processor, pending_output, scheduler
from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.llm_engine import LLMEngine
from raygrid.models.default_model import resolve_model_path

RECORD = {"on": False, "events": [], "host": []}
PHASES = [(core.EngineCore, "step", "step"), (scheduler.Scheduler, "schedule", "schedule"),
          (scheduler.Scheduler, "update_from_output", "update"), (pending_output.PendingRunnerOutput, "result", "result"),
          (model_runner.ModelRunner, "_prepare_inputs", "prepare"), (model_runner.ModelRunner, "_update_states", "update_states"),
          (model_runner.ModelRunner, "_sample", "sample"), (output_processor.OutputProcessor, "process", "outputs"),
          (llm_engine.LLMEngine, "step", "llm_step")]


def timed(method, tag: str):
    def wrapper(self, *args, **kwargs):
        if not RECORD["on"]:
            return method(self, *args, **kwargs)
        start = time.perf_counter()
        result = method(self, *args, **kwargs)
        RECORD["host"].append((tag, start, time.perf_counter()))
        return result
    return wrapper


def with_gpu_events(method):
    def wrapper(self, so, defer_grammar=False):
        if not RECORD["on"]:
            return method(self, so, defer_grammar)
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start = time.perf_counter()
        first.record()
        result = method(self, so, defer_grammar)
        last.record()
        RECORD["events"].append((start, time.perf_counter(), first, last))
        return result
    return wrapper


def install_hooks(parser: argparse.ArgumentParser) -> None:
    """Wrap the engine's host phases (PHASES) in ``timed`` and ``ModelRunner._execute`` in CUDA events; refuse to run
    without a GPU."""
    if not torch.cuda.is_available():
        parser.error("needs a GPU: CUDA events time the steps there")
    for cls, name, tag in PHASES:
        setattr(cls, name, timed(getattr(cls, name), tag))
    model_runner.ModelRunner._execute = with_gpu_events(model_runner.ModelRunner._execute)


def thread_cpu_seconds() -> dict[str, tuple[str, float]]:
    """CPU seconds of each thread of this process so far: {tid: (name, seconds)}."""
    ticks, seconds = os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="utf-8") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        seconds[tid] = (stat[stat.index("(") + 1:stat.rindex(")")], (int(fields[11]) + int(fields[12])) / ticks)
    return seconds


def timed_run(engine, prompt: list[int], tokens: int, sampling: dict) -> dict:
    torch.cuda.synchronize()
    base = torch.cuda.Event(enable_timing=True)
    base.record()
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    cpu_before, wall_start = thread_cpu_seconds(), time.perf_counter()
    RECORD.update(on=True, events=[], host=[])
    ttft, e2e, _ = time_raygrid(engine, [prompt], tokens, sampling).requests[0]
    RECORD["on"] = False
    wall, cpu_after = time.perf_counter() - wall_start, thread_cpu_seconds()
    torch.cuda.synchronize()
    events = RECORD["events"][5:-3]  # decode steps, past the prompt's
    host_start = np.array([(start - t0) * 1e3 for start, _, _, _ in events])
    host_end = np.array([(end - t0) * 1e3 for _, end, _, _ in events])
    gpu_start = np.array([base.elapsed_time(first) for _, _, first, _ in events])
    gpu_end = np.array([base.elapsed_time(last) for _, _, _, last in events])
    phases: dict[str, list[float]] = {}
    for tag, start, end in RECORD["host"]:
        phases.setdefault(tag, []).append((end - start) * 1e3)
    busy = {f"{tid}:{name}": round((seconds - cpu_before.get(tid, (name, 0.0))[1]) / wall, 3)
            for tid, (name, seconds) in cpu_after.items()}

    def median(x) -> float:
        return round(float(np.median(x)), 4)

    return dict(tpot_ms=(e2e - ttft) / (tokens - 1) * 1e3, step_period_ms=median(np.diff(host_start)),
                launch_host_ms=median(host_end - host_start), gpu_step_ms=median(gpu_end - gpu_start),
                gpu_idle_between_ms=median(gpu_start[1:] - gpu_end[:-1]), queue_lead_ms=median(gpu_start - host_start),
                thread_cpu_share={k: v for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v > 0.02},
                phases_ms={tag: median(times) for tag, times in phases.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--settings", default="off,on", help="off: layer by layer; on: --persistent-decode")
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--tag", default="")
    add_sampling_params_arg(parser)
    args = parser.parse_args()
    install_hooks(parser)
    rng = np.random.default_rng(0)
    report = {}
    for setting in args.settings.split(","):
        engine = LLMEngine.from_engine_args(EngineArgs(model=resolve_model_path("random-qwen3-0.6b"), dtype="bfloat16",
                                                       max_model_len=args.context + 600, persistent_decode=setting == "on"))
        time_raygrid(engine, [rng.integers(0, 10000, args.context).tolist()], 64, args.sampling_params)  # warm-up
        report[setting] = []
        for _ in range(2):
            row = timed_run(engine, rng.integers(0, 10000, args.context).tolist(), args.tokens, args.sampling_params)
            report[setting].append(row)
            print(setting, args.context, json.dumps(row), flush=True)
        engine.shutdown()
    with open(os.path.join(args.out_dir, f"step_timeline_{args.context}{args.tag}.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
