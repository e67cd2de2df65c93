"""`raygrid bench serve`: drive any OpenAI-compatible /v1/completions endpoint with a workload and
report throughput and latency (TTFT, ITL, TPOT, end-to-end: mean, median, p99).

Requests stream (server-sent events) with ``stream_options.include_usage`` so token counts come from
the server. Arrivals are a Poisson process at ``--request-rate`` (inf: all at once), at most
``--max-concurrency`` in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import statistics
import time
from dataclasses import dataclass, field

import httpx
from tqdm.auto import tqdm


@dataclass
class WorkItem:
    prompt: str | list[int]
    prompt_len: int | None
    output_len: int


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def add_serve_bench_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="server root, without /v1")
    parser.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--num-prompts", type=int, default=100)
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second (Poisson); inf sends all at once")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--dataset", default="random", help="'random' (token ids) or a JSONL file of {prompt, output_len?}")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--token-id-range", type=int, nargs=2, default=[10, 1000], help="token ids of random prompts are drawn from [lo, hi)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save-result", default=None, help="write the results as JSON here")
    parser.add_argument("--no-progress", action="store_true")


def load_workload(args: argparse.Namespace) -> list[WorkItem]:
    rng = random.Random(args.seed)
    if args.dataset == "random":
        lo, hi = args.token_id_range
        return [WorkItem([rng.randrange(lo, hi) for _ in range(args.input_len)], args.input_len, args.output_len) for _ in range(args.num_prompts)]
    items = []
    with open(args.dataset, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                items.append(WorkItem(row["prompt"], None, int(row.get("output_len", row.get("max_tokens", args.output_len)))))
    if not items:
        raise ValueError(f"--dataset {args.dataset}: no prompts in the file")
    return [items[i % len(items)] for i in range(args.num_prompts)]


async def send_one(client: httpx.AsyncClient, url: str, model: str, item: WorkItem) -> RequestResult:
    body = {
        "model": model,
        "prompt": item.prompt,
        "max_tokens": item.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = RequestResult(ok=False)
    start = time.perf_counter()
    last = start
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                result.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = chunk["error"].get("message", "error")
                    return result
                now = time.perf_counter()
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if chunk.get("usage"):
                    result.prompt_tokens = chunk["usage"]["prompt_tokens"]
                    result.output_tokens = chunk["usage"]["completion_tokens"]
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0
        if not result.ok:
            result.error = "no tokens in the response"
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def run_workload(args: argparse.Namespace, items: list[WorkItem]) -> tuple[list[RequestResult], float, str]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.base_url.rstrip("/")
    limits = httpx.Limits(max_connections=args.max_concurrency or len(items) or 1)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        model = args.model
        if model is None:
            model = (await client.get(f"{base}/v1/models")).json()["data"][0]["id"]
        semaphore = asyncio.Semaphore(args.max_concurrency or len(items) or 1)
        bar = tqdm(total=len(items), desc="requests", disable=args.no_progress)
        rng = random.Random(args.seed + 1)

        async def limited(item):
            async with semaphore:
                result = await send_one(client, f"{base}/v1/completions", model, item)
            bar.update(1)
            return result

        start = time.perf_counter()
        tasks = []
        for item in items:
            tasks.append(asyncio.create_task(limited(item)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return results, duration, model


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(ordered) * scale, "median": statistics.median(ordered) * scale, "p99": p99 * scale}


def summarize(args: argparse.Namespace, results: list[RequestResult], duration: float, model: str) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "base_url": args.base_url,
        "model": model,
        "num_prompts": len(results),
        "request_rate": args.request_rate,
        "max_concurrency": args.max_concurrency,
        "dataset": args.dataset,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "duration_s": duration,
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": output_tokens / duration if duration else 0.0,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration if duration else 0.0,
        "ttft_ms": percentiles([r.ttft for r in ok]),
        "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles([x for r in ok for x in r.itl]),
        "e2el_ms": percentiles([r.latency for r in ok]),
    }


def print_summary(summary: dict) -> None:
    print(f"{'completed / failed':<28}{summary['completed']} / {summary['failed']}")
    print(f"{'duration (s)':<28}{summary['duration_s']:.2f}")
    print(f"{'request throughput (req/s)':<28}{summary['request_throughput']:.2f}")
    print(f"{'output throughput (tok/s)':<28}{summary['output_throughput']:.1f}")
    print(f"{'total throughput (tok/s)':<28}{summary['total_token_throughput']:.1f}")
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
        s = summary[key]
        print(f"{label + ' (ms)':<28}mean {s['mean']:.2f}  median {s['median']:.2f}  p99 {s['p99']:.2f}")
    for error in summary["errors"]:
        print(f"error: {error}")


def check_server(args: argparse.Namespace) -> None:
    """Fail at once, in one line, if the server cannot be reached or refuses the key."""
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = f"{args.base_url.rstrip('/')}/v1/models"
    try:
        response = httpx.get(url, headers=headers, timeout=10)
    except httpx.HTTPError as error:
        raise ValueError(f"--base-url {args.base_url}: cannot reach the server ({type(error).__name__}: {error})") from None
    if response.status_code == 401:
        raise ValueError(f"--api-key: the server at {args.base_url} refused it (401)")
    if response.status_code != 200:
        raise ValueError(f"--base-url {args.base_url}: GET /v1/models answered {response.status_code}")


def run_serve_benchmark(args: argparse.Namespace) -> dict:
    check_server(args)
    items = load_workload(args)
    results, duration, model = asyncio.run(run_workload(args, items))
    summary = summarize(args, results, duration, model)
    print_summary(summary)
    if args.save_result:
        with open(args.save_result, "w", encoding="utf-8") as f:
            json.dump({**summary, "args": {k: v for k, v in vars(args).items() if k != "func"}}, f, indent=2, default=str)
    return summary

