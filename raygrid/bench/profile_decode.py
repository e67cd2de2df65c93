"""Profile of decode steps: which kernels run, how long the GPU is busy, and how much of a step is
CPU time around the GPU work. Used by ``raygrid bench throughput --profile-dir``, for a full batch
and for the small batch of long sequences that the end of a run leaves."""

from __future__ import annotations

import json
import os
import time

import numpy as np


def device_kernels(prof, steps: int, device_type: str = "CUDA") -> list[dict]:
    """The device kernels of a torch profile of ``steps`` steps, slowest first: name, calls, and microseconds a step
    two ways. ``us_per_step`` counts each launch from its start to its end: a kernel launched early by PDL counts
    its wait for the kernel before it. ``own_us_per_step`` counts only the time no earlier-started kernel was still
    running, so the kernels' own times add up to ``device_busy_us``."""
    totals: dict[str, list[float]] = {}
    end = float("-inf")
    for name, lo, hi in sorted(((e.name, e.time_range.start, e.time_range.end) for e in _device_events(prof, device_type)),
                               key=lambda event: event[1]):
        calls_us_own = totals.setdefault(name, [0, 0.0, 0.0])
        calls_us_own[0] += 1
        calls_us_own[1] += hi - lo
        if hi > end:
            calls_us_own[2] += hi - max(lo, end)
            end = hi
    kernels = [{"name": name[:120], "calls_per_step": calls / steps, "us_per_step": us / steps, "own_us_per_step": own / steps}
               for name, (calls, us, own) in totals.items()]
    kernels.sort(key=lambda k: -k["us_per_step"])
    return kernels


def _device_events(prof, device_type: str):
    return [e for e in prof.events() if e.device_type.name == device_type and e.time_range.end > e.time_range.start]


def device_busy_us(prof, device_type: str = "CUDA") -> float:
    """Microseconds the device had at least one kernel or copy running over a torch profile: the union of their
    intervals. Not their sum: a kernel launched early by programmatic dependent launch (PDL) starts while the
    kernel before it runs, and waits inside for it, so the sum counts that wait twice. (``device_type="CPU"``: the
    host's events, whose calls nest.)"""
    spans = sorted((e.time_range.start, e.time_range.end) for e in _device_events(prof, device_type))
    busy, end = 0.0, float("-inf")
    for lo, hi in spans:
        if hi > end:
            busy += hi - max(lo, end)
            end = hi
    return busy


def kernel_ms_by_step(prof, name: str, launches_per_step: int) -> list[float]:
    """Milliseconds the device spent in kernel ``name`` in each step of a torch profile, its launches taken in the
    order they ran, ``launches_per_step`` a step (a layer's kernel: the model's layers)."""
    calls = sorted((e.time_range.start, e.time_range.elapsed_us()) for e in prof.events()
                   if e.name == name and e.device_type.name == "CUDA")
    return [round(sum(us for _, us in calls[i:i + launches_per_step]) / 1e3, 2) for i in range(0, len(calls), launches_per_step)]


def profile_decode(llm, out_dir: str, bandwidth: float, num_reqs: int = 256, prompt_len: int = 512, steps: int = 10) -> dict:
    """Profile ``steps`` decode steps of ``num_reqs`` running requests; ``bandwidth`` (bytes/s, memory_floor's
    copy_bandwidth, measured before the engine started) sets the memory floor."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import SamplingParams
    from raygrid.bench.memory_floor import decode_floor
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config, resolve_dtype

    core = llm.engine
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=0.6, max_tokens=4 * steps + 64, ignore_eos=True, detokenize=False)
    ids = []
    for i in range(num_reqs):
        processed = llm.processor.process(f"profile-{i}", {"prompt_token_ids": rng.integers(0, 10000, prompt_len).tolist()}, params)
        for child in processed.children:
            core.add_request(child)
            ids.append(child.request_id)
    while core.stats().num_waiting or core.stats().num_running < num_reqs:  # finish every prefill
        core.step()
    for _ in range(3):
        core.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        core.step()
    wall_per_step = (time.perf_counter() - start) / steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            core.step()
        torch.cuda.synchronize()
    core.abort_requests(ids)
    kernels = device_kernels(prof, steps)
    gpu_us = device_busy_us(prof) / steps
    model_config = core.config.model
    hf_config = load_hf_config(resolve_model_path(model_config.model))
    dtype_bytes = resolve_dtype(model_config.dtype, hf_config, torch.device("cuda")).itemsize
    # The timed steps start after the prefills and three more steps: mid-window context per request.
    floor = decode_floor(hf_config, num_reqs, num_reqs * (prompt_len + 3 + steps), dtype_bytes,
                         bandwidth=bandwidth, quantization=model_config.quantization, kv_cache_dtype=core.config.cache.cache_dtype)
    summary = {
        "num_running": num_reqs,
        "context_len_start": prompt_len,
        "wall_ms_per_step": wall_per_step * 1e3,
        "gpu_busy_ms_per_step": gpu_us / 1e3,
        "cpu_only_ms_per_step": wall_per_step * 1e3 - gpu_us / 1e3,
        "memory_floor": floor,
        "wall_over_floor": wall_per_step * 1e3 / floor["floor_ms"],
        "top_kernels": kernels[:25],
    }
    os.makedirs(out_dir, exist_ok=True)
    name = os.path.join(out_dir, f"profile_decode_{num_reqs}x{prompt_len}")
    with open(f"{name}.json", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    with open(f"{name}.txt", "w", encoding="utf-8") as f:
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40))
    print(f"decode step with {num_reqs} running from context {prompt_len}: wall {summary['wall_ms_per_step']:.2f} ms, "
          f"GPU busy {summary['gpu_busy_ms_per_step']:.2f} ms, memory floor {floor['floor_ms']:.2f} ms "
          f"({summary['wall_over_floor']:.2f}x)")
    return summary
