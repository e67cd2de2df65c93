"""`raygrid bench throughput`: offline throughput of raygrid or of Hugging Face transformers on the
same prompts (random token ids), so a ratio comes from one run.

The reference workload (nano-vLLM's): 256 requests, prompt and output lengths each uniform in
[100, 1024] (seed 0), ignore_eos, on Qwen3-0.6B's shape in bf16:
    raygrid bench throughput --model random-qwen3-0.6b --num-prompts 256 --random-range 100 1024
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np


def add_throughput_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="raygrid", choices=["raygrid", "hf"])
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--random-range", type=int, nargs=2, metavar=("LO", "HI"), default=None,
                        help="prompt and output lengths each drawn uniformly from [LO, HI]")
    parser.add_argument("--temperature", type=float, default=0.6)
    add_sampling_params_arg(parser)
    parser.add_argument("--hf-batch-size", type=int, default=128, help="hf backend: prompts per padded generate() call")
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--detokenize", action="store_true", help="raygrid: detokenize the outputs, as a server must")
    parser.add_argument("--profile-dir", default=None, help="raygrid on GPU: also profile decode steps into this folder")


def add_sampling_params_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sampling-params", type=sampling_overrides, default={}, metavar="JSON",
                        help='raygrid: more SamplingParams fields for every request, e.g. \'{"repetition_penalty": 1.1, "logprobs": 5}\'')


def sampling_overrides(text: str) -> dict:
    """``--sampling-params``: a JSON object of SamplingParams fields, each checked by SamplingParams itself."""
    from raygrid import SamplingParams

    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of SamplingParams fields, got {type(fields).__name__}")
    for reserved in ("max_tokens", "ignore_eos", "detokenize"):
        if reserved in fields:
            raise argparse.ArgumentTypeError(f"{reserved} is the benchmark's own (lengths come from the workload)")
    try:
        SamplingParams(**fields)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return fields


def make_workload(num_prompts: int, input_len, output_len, random_range, seed: int, vocab_size: int):
    """Prompt token ids and output lengths, reproducible from the seed."""
    rng = np.random.default_rng(seed)
    if random_range is not None:
        lo, hi = random_range
        prompt_lens = rng.integers(lo, hi + 1, size=num_prompts)
        output_lens = rng.integers(lo, hi + 1, size=num_prompts)
    else:
        if input_len is None or output_len is None:
            raise ValueError("give --input-len and --output-len, or --random-range LO HI")
        prompt_lens = np.full(num_prompts, input_len)
        output_lens = np.full(num_prompts, output_len)
    high = min(vocab_size, 10000)
    prompts = [rng.integers(0, high, size=int(n)).tolist() for n in prompt_lens]
    return prompts, [int(n) for n in output_lens]


def run_raygrid(args, engine_kwargs: dict, prompts, output_lens) -> dict:
    from raygrid import LLM, SamplingParams
    from raygrid.engine.core import EngineCore

    bandwidth = None
    if args.profile_dir:  # the profiles' memory floor: measured before the engine takes the GPU's memory
        import torch

        from raygrid.bench.memory_floor import copy_bandwidth

        bandwidth = copy_bandwidth(torch.device("cuda"))
    llm = LLM(**engine_kwargs)
    try:
        warmup = [SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)] * 4
        llm.generate([{"prompt_token_ids": p[:16]} for p in prompts[:4]], warmup, use_tqdm=False)
        fields = {"temperature": args.temperature, **args.sampling_params}
        params = [SamplingParams(**fields, max_tokens=n, ignore_eos=True, detokenize=args.detokenize) for n in output_lens]
        traced = isinstance(llm.engine, EngineCore)  # an in-process engine (a Ray replica keeps its steps to itself)
        if traced:
            llm.engine.step_trace = []
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=not args.no_progress)
        elapsed = time.perf_counter() - start
        errors = [o.error for o in outputs if o.error]
        if errors:
            raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
        generated = sum(len(c.token_ids) for o in outputs for c in o.outputs)  # every completion of n > 1
        result = {"elapsed_s": elapsed, "output_tokens": generated, "step_timing": llm.engine.step_timing(),
                  "max_num_batched_tokens": llm.config.scheduler.max_num_batched_tokens,
                  "persistent_decode": llm.config.model.persistent_decode}  # a lone request's passes (the run's tail)
        if engine_kwargs.get("enable_eplb"):
            result["eplb"] = eplb_summary(llm)
        if traced:
            result["where_the_time_goes"] = summarize_steps(start, llm.engine.step_trace)
            llm.engine.step_trace = None
            result["memory"] = llm.engine.executor.collective_rpc("memory_report")[0]
        if args.profile_dir:
            from raygrid.bench.profile_decode import profile_decode

            result["decode_profiles"] = [
                profile_decode(llm, args.profile_dir, bandwidth, num_reqs=min(256, len(prompts)), prompt_len=512),
                profile_decode(llm, args.profile_dir, bandwidth, num_reqs=min(32, len(prompts)), prompt_len=1536),
            ]
        return result
    finally:
        llm.shutdown()


def eplb_summary(llm) -> dict:
    """The EPLB rebalances of the run, as the first worker saw them (every EP rank rebalances together)."""
    engine = llm.engine
    reports = engine.collective_rpc("eplb_reports")[0] if hasattr(engine, "transports") else engine.executor.collective_rpc("eplb_reports")
    reports = reports[0]
    stats = llm.get_stats()
    print(f"  EPLB: {len(reports)} rebalances; balancedness " + ", ".join(
        f"{r['balancedness_before']:.3f} -> {r['balancedness_after']:.3f} ({r['seconds'] * 1000:.0f} ms, {r['moved_experts']} moved)"
        for r in reports[:4]) + (" ..." if len(reports) > 4 else ""))
    return {"rebalances": reports, "expert_balancedness": stats.expert_balancedness}


def summarize_steps(start: float, trace: list[tuple[float, int, int]]) -> list[dict]:
    """Seconds spent in steps that carry prompt tokens and in decode-only steps by batch size; a step's
    time is the interval since the previous step finished, and ``max_ms`` is a bucket's slowest (a stall shows there).
    The steps with prompt tokens are few and vary most from run to run, so their bucket also lists each one
    (``each``: ms, tokens scheduled, requests)."""
    buckets = {kind: [0, 0.0, 0.0] for kind in STEP_KINDS}
    prompt_steps = []
    previous = start
    for finished, num_tokens, num_reqs in trace:
        key = step_kind(num_tokens, num_reqs)
        if key == PROMPT_STEPS:
            prompt_steps.append({"ms": round(1e3 * (finished - previous), 2), "tokens": num_tokens, "requests": num_reqs})
        buckets[key][0] += 1
        buckets[key][1] += finished - previous
        buckets[key][2] = max(buckets[key][2], finished - previous)
        previous = finished
    summary = [{"steps": n, "seconds": round(sec, 3), "ms_per_step": round(1e3 * sec / n, 2) if n else None,
                "max_ms": round(1e3 * slowest, 2) if n else None, "kind": kind}
               for kind, (n, sec, slowest) in buckets.items()]
    summary[0]["each"] = prompt_steps
    return summary


def decode_bucket(lo: int, hi: int | None) -> str:
    return f"decode, {lo}-{hi} requests" if hi is not None else f"decode, {lo}+ requests"


DECODE_SIZES = ((1, 15), (16, 63), (64, 127), (128, 255), (256, None))  # (fewest, most) requests running
PROMPT_STEPS = "with prompt tokens"
STEP_KINDS = (PROMPT_STEPS, *(decode_bucket(lo, hi) for lo, hi in DECODE_SIZES))


def step_kind(num_tokens: int, num_reqs: int) -> str:
    """The bucket of ``where_the_time_goes`` a step of ``num_tokens`` scheduled tokens over ``num_reqs`` requests
    falls in: one with prompt tokens, or decode-only by how many requests run."""
    if num_tokens > num_reqs:
        return PROMPT_STEPS
    return decode_bucket(*next((lo, hi) for lo, hi in DECODE_SIZES if hi is None or num_reqs <= hi))


def run_hf(args, model_path: str, dtype: str, prompts, output_lens) -> dict:
    """transformers' own generate(): padded static batches (sorted by length), ignore_eos."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM

    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i : i + args.hf_batch_size] for i in range(0, len(order), args.hf_batch_size)]
    do_sample = args.temperature > 0
    start = time.perf_counter()
    for batch in tqdm(batches, desc="hf batches", disable=args.no_progress):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, i in enumerate(batch):  # left padding
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        new_tokens = max(output_lens[i] for i in batch)
        with torch.no_grad():
            model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                           do_sample=do_sample, temperature=args.temperature if do_sample else None, pad_token_id=0)
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    # Only the tokens each request asked for count; the rest of a padded batch is transformers' overhead.
    return {"elapsed_s": elapsed, "output_tokens": sum(output_lens), "step_timing": None}


def git_commit() -> str | None:
    """The commit of the checkout that ran the benchmark (None outside a git checkout). RAYGRID_GIT_COMMIT
    overrides it where the checkout's .git is not the code's (a copied working tree)."""
    import subprocess

    if os.environ.get("RAYGRID_GIT_COMMIT"):
        return os.environ["RAYGRID_GIT_COMMIT"]

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    return f"CPU ({platform.processor() or platform.machine()})"


def provenance(program: str = "python") -> dict:
    """What a recorded result says about itself: the machine, the date (UTC), the commit and the command
    (``program`` and this process's arguments)."""
    return {"machine": device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "command": " ".join([program] + sys.argv)}


def kernel_settings() -> dict | None:
    """The attention kernels' launch settings this process runs (their environment overrides included)."""
    try:
        from raygrid.kernels.triton_attention import DECODE_CONFIG, DECODE_SPLIT_POLICY, PREFILL_CONFIG, PREFILL_SHORT_CONFIG
    except ImportError:  # no Triton: the torch references run
        return None
    return {"prefill": PREFILL_CONFIG, "prefill_short": PREFILL_SHORT_CONFIG, "decode": DECODE_CONFIG, "decode_splits": DECODE_SPLIT_POLICY}


def run_throughput_benchmark(args: argparse.Namespace, engine_kwargs: dict) -> dict:
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    model_path = resolve_model_path(engine_kwargs["model"])
    vocab = load_hf_config(model_path).vocab_size
    prompts, output_lens = make_workload(args.num_prompts, args.input_len, args.output_len, args.random_range, args.seed, vocab)
    if args.backend == "raygrid":
        longest = max(len(p) + n for p, n in zip(prompts, output_lens))
        engine_kwargs = dict(engine_kwargs, model=model_path, max_model_len=engine_kwargs.get("max_model_len") or max(longest, 2048))
        result = run_raygrid(args, engine_kwargs, prompts, output_lens)
    else:
        if args.sampling_params:
            raise ValueError("--sampling-params applies to the raygrid backend only")
        result = run_hf(args, model_path, engine_kwargs.get("dtype", "auto"), prompts, output_lens)
    prompt_tokens = sum(len(p) for p in prompts)
    elapsed = result["elapsed_s"]
    summary = {
        "backend": args.backend,
        "model": engine_kwargs["model"],
        "num_prompts": len(prompts),
        "prompt_tokens": prompt_tokens,
        "output_tokens": result["output_tokens"],
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(len(prompts) / elapsed, 3),
        "output_tokens_per_s": round(result["output_tokens"] / elapsed, 1),
        "total_tokens_per_s": round((prompt_tokens + result["output_tokens"]) / elapsed, 1),
        "step_timing": result["step_timing"],
        "where_the_time_goes": result.get("where_the_time_goes"),
        "decode_profiles": result.get("decode_profiles"),
        "memory": result.get("memory"),
        "eplb": result.get("eplb"),
        "attention_kernels": kernel_settings() if args.backend == "raygrid" else None,
        "max_num_batched_tokens": result.get("max_num_batched_tokens"),
        "persistent_decode": result.get("persistent_decode"),
        "sampling_params": {"temperature": args.temperature, **args.sampling_params},
        "machine": device_name(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": " ".join(["raygrid"] + sys.argv[1:]),
    }
    for bucket in result.get("where_the_time_goes") or []:
        slowest = f", slowest {bucket['max_ms']:.1f} ms" if bucket["steps"] else ""
        print(f"  {bucket['kind']:>26}: {bucket['steps']:5d} steps, {bucket['seconds']:7.3f} s{slowest}")
    print(f"{args.backend}: {summary['requests_per_s']:.2f} requests/s, {summary['output_tokens_per_s']:.1f} output tok/s, "
          f"{summary['total_tokens_per_s']:.1f} total tok/s ({summary['output_tokens']} output tokens in {elapsed:.2f} s)")
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    return summary
