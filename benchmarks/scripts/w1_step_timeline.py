"""Where W1's steps go, host or GPU (GPU only): ``step_timeline.py``'s hooks (the engine's host phases by
``perf_counter``, each step's GPU work between two CUDA events aligned to the host clock) over W1 itself
(``raygrid bench throughput``'s workload: 256 requests, lengths uniform in [100, 1024]) on one engine, run twice:
the first warms it, the second is recorded (or, with ``--prefill-tile-choices``, one recorded run a choice). Step by
step for the steps with prompt tokens and for ten decode steps from ``--decode-at`` on:

- ``host_ms``: the host's time to launch the step (``ModelRunner._execute``: inputs, forward, sampling);
- ``gpu_ms``: from the GPU reaching the step's first event to its last;
- ``gpu_idle_before_ms``: how long the GPU sat idle between the step before and this one (the host was late);
- ``queue_lead_ms``: how long the step waited on the GPU after the host launched it;
- ``phases_ms``: the host's time in the engine's parts between this step's launch and the next one's;

and, over every step of the run by kind (``buckets``: ``where_the_time_goes``'s, ``throughput.step_kind``), the steps'
GPU time and the GPU's idle time before them, in seconds.

    python benchmarks/scripts/w1_step_timeline.py OUT.json [--model random-qwen3-0.6b] [--decode-at 300]
    python benchmarks/scripts/w1_step_timeline.py OUT.json \
        --prefill-tile-choices '{"split_decode_rows": 0}' '{}' '{"split_decode_rows": 0}' '{}'  # an A/B, one engine
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_timeline import RECORD, install_hooks  # noqa: E402

from raygrid import LLM, SamplingParams  # noqa: E402
from raygrid.bench.throughput import make_workload, provenance, step_kind  # noqa: E402
from raygrid.kernels import triton_attention  # noqa: E402
from raygrid.models.default_model import resolve_model_path  # noqa: E402
from raygrid.models.loader import load_hf_config  # noqa: E402


def run(llm, prompts, params) -> tuple[float, list, list]:
    """W1 once; the elapsed seconds, and the raw records (GPU events, host phases) of its steps."""
    assert llm.reset_prefix_cache(), "the prefix cache must be empty: each run prefills its prompts again"
    engine = llm.llm_engine
    torch.cuda.synchronize()
    RECORD.update(on=True, events=[], host=[])
    start = time.perf_counter()
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(f"{time.monotonic_ns()}-{i}", {"prompt_token_ids": prompt}, p)
    while engine.has_unfinished_requests():
        engine.step(emit_unfinished=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    RECORD["on"] = False
    return elapsed, RECORD["events"], RECORD["host"]


def per_step(events, host, t0: float, base, steps: range, tokens: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for i in steps:
        if i + 1 >= len(events):
            break
        start, end, first, last = events[i]
        gpu_start, gpu_end = base.elapsed_time(first), base.elapsed_time(last)
        prev_end = base.elapsed_time(events[i - 1][3]) if i > 0 else gpu_start
        window_end = events[i + 1][0]
        phases: dict[str, float] = {}
        for tag, a, b in host:
            if start <= a < window_end and tag not in ("step", "llm_step"):
                phases[tag] = round(phases.get(tag, 0.0) + (b - a) * 1e3, 3)
        rows.append(dict(step=i, tokens=tokens[i][0] if i < len(tokens) else None, requests=tokens[i][1] if i < len(tokens) else None,
                         host_ms=round((end - start) * 1e3, 3), gpu_ms=round(gpu_end - gpu_start, 3),
                         gpu_idle_before_ms=round(max(0.0, gpu_start - prev_end), 3),
                         queue_lead_ms=round(gpu_start - (start - t0) * 1e3, 3), phases_ms=phases))
    return rows


def buckets(events, base, tokens: list[tuple[int, int]]) -> dict:
    """GPU seconds and the GPU's idle seconds before each step, summed by the step's kind."""
    out: dict[str, dict] = {}
    for i, (_, _, first, last) in enumerate(events):
        if i >= len(tokens):
            break
        num_tokens, requests = tokens[i]
        name = step_kind(num_tokens, requests)
        gpu_start, gpu_end = base.elapsed_time(first), base.elapsed_time(last)
        idle = max(0.0, gpu_start - base.elapsed_time(events[i - 1][3])) if i > 0 else 0.0
        b = out.setdefault(name, dict(steps=0, gpu_s=0.0, idle_before_s=0.0))
        b.update(steps=b["steps"] + 1, gpu_s=b["gpu_s"] + (gpu_end - gpu_start) / 1e3,
                 idle_before_s=b["idle_before_s"] + idle / 1e3)
    return {k: {n: round(x, 4) if isinstance(x, float) else x for n, x in v.items()} for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--decode-at", type=int, default=300)
    parser.add_argument("--prefill-tile-choices", nargs="+", type=json.loads, default=None,
                        help="a timed run for each, on one engine: a JSON object over the defaults of how steps past "
                             "the mixed graphs launch prompt attention (triton_attention.PREFILL_TILE_CHOICE, e.g. "
                             "'{\"rule\": \"shape\"}'), for an A/B without restarts")
    args = parser.parse_args()
    choices = []  # each given choice over the defaults, checked before the engine starts
    for given in args.prefill_tile_choices or []:
        try:
            choice = triton_attention.with_overrides(triton_attention.PREFILL_TILE_CHOICE, given, "--prefill-tile-choices")
            triton_attention.check_tile_choice(choice, "--prefill-tile-choices")
        except ValueError as e:
            parser.error(str(e))
        choices.append(choice)
    install_hooks(parser)
    model_path = resolve_model_path(args.model)
    prompts, output_lens = make_workload(args.num_prompts, None, None, (100, 1024), 0, load_hf_config(model_path).vocab_size)
    longest = max(len(p) + n for p, n in zip(prompts, output_lens))
    llm = LLM(model=model_path, dtype="bfloat16", max_model_len=max(longest, 2048))
    params = [SamplingParams(temperature=0.6, max_tokens=int(n), ignore_eos=True, detokenize=False) for n in output_lens]
    run(llm, prompts, params)  # warm
    reports = []
    for given, choice in zip(args.prefill_tile_choices or [None], choices or [None]):
        if choice is not None:
            triton_attention.PREFILL_TILE_CHOICE.update(choice)
        report = timed_run(llm, prompts, params, output_lens, args)
        reports.append(dict(report, prefill_tile_choice=choice) if choice is not None else report)
        tag = f"[{json.dumps(given)}] " if choice is not None else ""
        print(f"{tag}W1 {report['output_tok_s']} output tok/s, {report['steps']} steps")
        for name in ("prompt_steps", "decode_steps"):
            for row in report[name]:
                print(f"{tag}{name}", json.dumps(row))
        print(f"{tag}buckets", json.dumps(report["buckets"]))
    result = {**reports[0], **provenance()} if len(reports) == 1 else {"runs": reports, **provenance()}
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    llm.shutdown()


def timed_run(llm, prompts, params, output_lens, args) -> dict:
    """W1 once more on the warm engine, step by step."""
    core = llm.engine
    core.step_trace = []
    base = torch.cuda.Event(enable_timing=True)
    base.record()
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    elapsed, events, host = run(llm, prompts, params)
    tokens = [(t, r) for _, t, r in core.step_trace]
    core.step_trace = None
    prompt_steps = sum(1 for t, r in tokens if t > r)
    return {"model": args.model, "output_tok_s": round(sum(output_lens) / elapsed, 1), "steps": len(events),
            "prompt_steps": per_step(events, host, t0, base, range(prompt_steps + 3), tokens),
            "decode_steps": per_step(events, host, t0, base, range(args.decode_at, args.decode_at + 10), tokens),
            "buckets": buckets(events, base, tokens)}


if __name__ == "__main__":
    main()
