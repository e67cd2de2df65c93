"""`raygrid bench latency`: what one user waits for, as vLLM's `bench latency` measures it. For each prompt
length, a batch (default 1) of fresh random prompts runs alone, several times: each request's time to its first token
(TTFT) and per output token after it (TPOT), and the batch's own two figures: its prefill (until every prompt has its
first token) and its decode step (while every request of the batch decodes), against that step's memory floor.

In a batch of several, each request's TTFT and TPOT are what its user waits for: the engine prefills the prompts
one step budget after another, so the first request decodes beside the later prompts' chunks, and its TPOT counts
them. The batch's figures leave them out: the prefill rate counts the whole batch's prompts over the time they all
took, and the decode step is timed from one step to the next only where every request decoded in both. For a lone
request the decode step is its TPOT. With ``--backend hf`` the same prompts go through transformers' ``generate()``
(SDPA attention), whose batch prefills at once and then decodes together, so a ratio comes from one run.

    raygrid bench latency --model random-qwen3-0.6b --dtype bfloat16 --input-len 512 8192 32768 --output-len 128
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import NamedTuple

import numpy as np

from raygrid.bench.throughput import add_sampling_params_arg, device_name, git_commit, kernel_settings


def add_latency_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="raygrid", choices=["raygrid", "hf"])
    parser.add_argument("--input-len", type=int, nargs="+", default=[512, 8192, 32768], help="prompt lengths to measure")
    parser.add_argument("--output-len", type=int, default=128, help="tokens generated per request (at least 2)")
    parser.add_argument("--batch-size", type=int, default=1, help="requests sent together")
    parser.add_argument("--num-iters", type=int, default=5, help="timed runs per prompt length")
    parser.add_argument("--num-iters-warmup", type=int, default=1, help="untimed runs per prompt length")
    add_sampling_params_arg(parser)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--profile-dir", default=None,
                        help="raygrid on GPU: also profile batch-size decode steps at each prompt length into this folder")


class _Prompts:
    """Fresh random prompts for every run: a prompt seen before would be served from the prefix cache."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.high = min(vocab_size, 10000)

    def batch(self, size: int, length: int) -> list[list[int]]:
        return [self.rng.integers(0, self.high, size=length).tolist() for _ in range(size)]


class RequestTiming(NamedTuple):
    """One request of a timed batch, in seconds from the batch's start."""

    ttft_s: float
    e2e_s: float
    gaps_s: list[float] | None  # between its tokens' arrivals after the first (None where the backend does not see them)


class BatchTiming(NamedTuple):
    """One timed batch: each request's times, when the last of its prompts had its first token (seconds from the
    start), and its decode steps (seconds each) while every request decoded (``whole_batch_steps``)."""

    requests: list[RequestTiming]
    prefilled_s: float
    decode_steps_s: list[float]


def whole_batch_steps(step_ends: list[float], delivered: list[int], batch: int) -> list[float]:
    """The batch's decode steps, from the host's view of its steps: ``step_ends[i]`` when step i returned and
    ``delivered[i]`` how many of the ``batch`` requests it brought a token. A step that brought every request a token,
    after a step that did the same, was a decode step of the whole batch: each request had its first token already.
    Its time is from the one before's end. (A step that brings the last prompt's first token also brings the others
    theirs, but it carried that prompt's chunk: the step before it did not bring that request a token.)"""
    return [step_ends[i] - step_ends[i - 1] for i in range(1, len(step_ends))
            if delivered[i] == batch and delivered[i - 1] == batch]


def time_raygrid(engine, prompts: list[list[int]], output_len: int, sampling: dict | None = None) -> BatchTiming:
    """``prompts`` run together on an ``LLMEngine`` (``BatchTiming``); ``sampling``: more SamplingParams fields
    (temperature 1 unless it says otherwise)."""
    from raygrid import SamplingParams

    params = SamplingParams(**{"temperature": 1.0, **(sampling or {})}, max_tokens=output_len, ignore_eos=True, detokenize=False)
    ids = [engine.next_request_id() for _ in prompts]
    arrivals: dict[str, list[float]] = {rid: [] for rid in ids}  # each step that brought a request tokens
    done: dict[str, float] = {}
    step_ends: list[float] = []
    delivered: list[int] = []
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        brought = 0
        for out in outputs:
            if out.outputs and out.outputs[0].token_ids:
                arrivals[out.request_id].append(now)
                brought += 1
            if out.finished:
                done[out.request_id] = now
        step_ends.append(now)
        delivered.append(brought)
    for rid in ids:
        if rid not in done:
            raise RuntimeError(f"request {rid} did not finish")
    requests = [RequestTiming(arrivals[rid][0] - start, done[rid] - start, np.diff(arrivals[rid]).tolist()) for rid in ids]
    return BatchTiming(requests, max(r.ttft_s for r in requests), whole_batch_steps(step_ends, delivered, len(ids)))


def time_hf(model, prompts: list[list[int]], output_len: int) -> BatchTiming:
    """transformers: one generate() of the whole output, timed at its first new token and at its end, as raygrid's
    requests are (a streamer sees each step's tokens on the host; its first call carries the prompt). The batch
    prefills at once and decodes together, so its decode step is its time per token after the first."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class FirstToken(BaseStreamer):
        def __init__(self) -> None:
            self.calls, self.at = 0, None

        def put(self, value) -> None:
            self.calls += 1
            if self.calls == 2:
                self.at = time.perf_counter()

        def end(self) -> None:
            pass

    ids = torch.tensor(prompts, device=model.device)
    first = FirstToken()
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=output_len, min_new_tokens=output_len,
                       do_sample=True, temperature=1.0, top_k=0, pad_token_id=0, streamer=first)
    if ids.is_cuda:
        torch.cuda.synchronize()
    end = time.perf_counter()
    ttft, e2e = first.at - start, end - start
    return BatchTiming([RequestTiming(ttft, e2e, None)] * len(prompts), ttft, [(e2e - ttft) / (output_len - 1)])


def summarize(runs: list[BatchTiming], output_len: int) -> dict:
    requests = [request for run in runs for request in run.requests]
    ttft = np.array([request.ttft_s for request in requests])
    e2e = np.array([request.e2e_s for request in requests])
    tpot = (e2e - ttft) / (output_len - 1)
    # Each run to a microsecond (TTFT) or 0.1 us (TPOT), and the statistics of those same values, so a median
    # always lies between the runs it is reported with.
    ttft_ms, tpot_ms = np.round(ttft * 1e3, 3), np.round(tpot * 1e3, 4)
    prefill_ms = np.round(np.array([run.prefilled_s for run in runs]) * 1e3, 3)
    steps_ms = np.array([step for run in runs for step in run.decode_steps_s]) * 1e3
    return {
        "ttft_ms": {"median": round(float(np.median(ttft_ms)), 4), "p90": round(float(np.percentile(ttft_ms, 90)), 4),
                    "each": ttft_ms.tolist()},
        "tpot_ms": {"median": round(float(np.median(tpot_ms)), 5), "p90": round(float(np.percentile(tpot_ms, 90)), 5),
                    "each": tpot_ms.tolist()},
        "e2e_s": {"median": float(np.median(e2e)), "p90": float(np.percentile(e2e, 90))},
        "batch_prefill_ms": {"median": round(float(np.median(prefill_ms)), 4), "each": prefill_ms.tolist()},
        "decode_step_ms": ({"median": round(float(np.median(steps_ms)), 4), "max": round(float(steps_ms.max()), 4),
                            "count": int(steps_ms.size)} if steps_ms.size else None),
        "token_gap_ms": _token_gaps([request.gaps_s for request in requests]),
    }


def _token_gaps(gaps: list[list[float] | None]) -> dict | None:
    """Where a request's time after its first token goes, from each run's gaps between token arrivals (None where
    the backend does not see them): their median, mean and slowest over all runs, and the median first and last gap
    of a run (a cost at either end of a request shows there, and not in the median; one stall shows in the mean)."""
    gaps = [g for g in gaps if g]
    if not gaps:
        return None
    every = np.concatenate(gaps) * 1e3
    return {"median": round(float(np.median(every)), 4), "mean": round(float(every.mean()), 4),
            "max": round(float(every.max()), 4),
            "first": round(float(np.median([g[0] for g in gaps])) * 1e3, 4),
            "last": round(float(np.median([g[-1] for g in gaps])) * 1e3, 4), "count": int(every.size)}


def prefill_flops(hf_config, num_tokens: int) -> float:
    """Multiply-adds x 2 of one causal prefill of ``num_tokens``: the layers' matrices (attention and MLP)
    and the attention scores and mixing, counted at half for causality."""
    c = hf_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    attention = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    matrices = 2 * num_tokens * c.num_hidden_layers * (attention + mlp)
    scores = 4 * num_tokens * num_tokens * head_dim * c.num_attention_heads * c.num_hidden_layers / 2
    return matrices + scores


def run_latency_benchmark(args: argparse.Namespace, engine_kwargs: dict) -> dict:
    from raygrid.bench.memory_floor import copy_bandwidth, decode_floor
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    if args.output_len < 2:
        raise ValueError(f"--output-len must be >= 2 (got {args.output_len}): the time per output token needs two")
    model_path = resolve_model_path(engine_kwargs["model"])
    hf_config = load_hf_config(model_path)
    prompts = _Prompts(args.seed, hf_config.vocab_size)
    longest = max(args.input_len) + args.output_len
    bandwidth = copy_bandwidth(_device(engine_kwargs))  # before the engine takes the GPU's memory; None on CPU
    close, run_one, profile, settings = _open_backend(args, dict(engine_kwargs, model=model_path), longest, bandwidth)
    rows = []
    try:
        for input_len in args.input_len:
            for _ in range(args.num_iters_warmup):
                run_one(prompts.batch(args.batch_size, input_len), args.output_len)
            runs = []
            for _ in range(args.num_iters):
                runs.append(run_one(prompts.batch(args.batch_size, input_len), args.output_len))
            row = {"input_len": input_len, **summarize(runs, args.output_len)}
            prefill_s = row["batch_prefill_ms"]["median"] / 1e3
            row["prefill_tflop_per_s"] = args.batch_size * prefill_flops(hf_config, input_len) / prefill_s / 1e12
            mid_context = args.batch_size * (input_len + args.output_len // 2)
            row["decode_floor_ms"] = row["decode_step_over_floor"] = None  # on CPU: no floor
            if bandwidth is not None:
                row["decode_floor_ms"] = decode_floor(
                    hf_config, args.batch_size, mid_context, _dtype_bytes(engine_kwargs, hf_config), bandwidth=bandwidth,
                    quantization=engine_kwargs.get("quantization"), kv_cache_dtype=engine_kwargs.get("kv_cache_dtype", "auto"),
                )["floor_ms"]
                if row["decode_step_ms"]:
                    row["decode_step_over_floor"] = row["decode_step_ms"]["median"] / row["decode_floor_ms"]
            if profile is not None:
                row["decode_profile"] = profile(input_len)
            rows.append(row)
            print(_describe(row, args.batch_size), flush=True)
    finally:
        close()
    summary = {
        "backend": args.backend, "model": engine_kwargs["model"], "dtype": engine_kwargs.get("dtype", "auto"),
        "batch_size": args.batch_size, "output_len": args.output_len, "num_iters": args.num_iters, "results": rows,
        "sampling_params": args.sampling_params,
        "attention_kernels": kernel_settings() if args.backend == "raygrid" else None, **settings,
        "copy_bandwidth_bytes_per_s": bandwidth, "machine": device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "command": " ".join(["raygrid"] + sys.argv[1:]),
    }
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    return summary


def _describe(row: dict, batch_size: int) -> str:
    """A row of the benchmark as one line: the request's figures, then (for a batch) the batch's own."""
    line = f"input {row['input_len']:6d}: TTFT {row['ttft_ms']['median']:9.2f} ms"
    if batch_size > 1:
        line += f", the batch's prefill {row['batch_prefill_ms']['median']:.2f} ms"
    line += f" ({row['prefill_tflop_per_s']:.1f} TFLOP/s), TPOT {row['tpot_ms']['median']:7.3f} ms"
    step = row["decode_step_ms"]
    if step is None:
        line += ", decode step: none had the whole batch (a longer --output-len gives some)"
    else:
        line += f", decode step {step['median']:7.3f} ms"
        if row["decode_floor_ms"] is not None:
            line += f" (floor {row['decode_floor_ms']:.3f} ms, {row['decode_step_over_floor']:.2f}x)"
    line += f", E2E {row['e2e_s']['median']:.3f} s"
    gaps = row["token_gap_ms"]
    if gaps:
        line += (f"; between tokens {gaps['median']:.3f} ms, first {gaps['first']:.3f}, last {gaps['last']:.3f}, "
                 f"slowest {gaps['max']:.3f}")
    return line


def _device(engine_kwargs: dict):
    """The device the benchmark runs on, as the engine resolves ``device="auto"``."""
    import torch

    return torch.device("cuda" if engine_kwargs.get("device") != "cpu" and torch.cuda.is_available() else "cpu")


def _dtype_bytes(engine_kwargs: dict, hf_config) -> int:
    """Bytes per weight and KV element of the engine's dtype ("auto": the checkpoint's, as the engine resolves it)."""
    from raygrid.models.loader import resolve_dtype

    return resolve_dtype(engine_kwargs.get("dtype", "auto"), hf_config, _device(engine_kwargs)).itemsize


def _open_backend(args, engine_kwargs: dict, longest: int, bandwidth: float | None):
    """(close, run one batch, profile at a prompt length or None, the engine's settings the record names) for the chosen
    backend: the step budget, and whether the decode passes of one or two requests may take the persistent launch (the engine
    takes it on one GPU where the model allows)."""
    if args.backend == "hf":
        if args.sampling_params:
            raise ValueError("--sampling-params applies to the raygrid backend only")
        import torch
        from transformers import AutoModelForCausalLM

        dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            engine_kwargs.get("dtype", "auto")]
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(engine_kwargs["model"], dtype=dtype, attn_implementation="sdpa").to(device).eval()
        model.generation_config.eos_token_id = None
        return (lambda: None), (lambda prompts, n: time_hf(model, prompts, n)), None, {"max_num_batched_tokens": None, "persistent_decode": None}

    from raygrid.engine.arg_utils import EngineArgs
    from raygrid.engine.llm_engine import LLMEngine

    engine_kwargs = dict(engine_kwargs, max_model_len=engine_kwargs.get("max_model_len") or longest)
    engine = LLMEngine.from_engine_args(EngineArgs(**engine_kwargs))
    profile = None
    if args.profile_dir:
        from raygrid.bench.profile_decode import profile_decode

        profile = lambda input_len: profile_decode(engine, args.profile_dir, bandwidth, num_reqs=args.batch_size,
                                                       prompt_len=input_len)  # noqa: E731
    settings = {"max_num_batched_tokens": engine.config.scheduler.max_num_batched_tokens,
                "persistent_decode": engine.config.model.persistent_decode}
    return engine.shutdown, (lambda prompts, n: time_raygrid(engine, prompts, n, args.sampling_params)), profile, settings
