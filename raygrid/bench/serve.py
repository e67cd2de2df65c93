"""`raygrid bench serve`: drive any OpenAI-compatible /v1/completions endpoint with a workload and
report throughput and latency (TTFT, ITL, TPOT, end-to-end: mean, median, p99).

Requests stream (server-sent events) with ``stream_options.include_usage`` and
``continuous_usage_stats``, so token counts come from the server. TTFT is the arrival of the first chunk
that carries a token, whether or not its text is empty (a token can decode to nothing yet); a request that
produced no token failed, it is not a 0 ms measurement. Arrivals are a Poisson process at
``--request-rate`` (inf: all at once), at most ``--max-concurrency`` in flight. The JSON uses the key names
of vLLM's serving benchmark (``mean_ttft_ms``, ``request_goodput``, ...), and ``--goodput ttft:MS tpot:MS``
counts the requests that met every SLO.
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
    ttft: float | None = None
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""
    start: float = 0.0  # when it was sent, in seconds since the run began


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
    parser.add_argument("--goodput", nargs="+", default=None, metavar="METRIC:MS",
                        help="SLOs for goodput, e.g. ttft:200 tpot:50 (metrics: ttft, tpot, e2el)")
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


async def send_one(client: httpx.AsyncClient, url: str, model: str, item: WorkItem, began: float = 0.0) -> RequestResult:
    body = {
        "model": model,
        "prompt": item.prompt,
        "max_tokens": item.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    start = time.perf_counter()
    result = RequestResult(ok=False, start=start - began if began else 0.0)
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
                usage = chunk.get("usage") or {}
                # A chunk carries tokens when the server's running count grows (or, from a server without
                # continuous usage, when it has a choice at all): text may be empty for a token.
                tokens_so_far = usage.get("completion_tokens")
                carries = bool(chunk.get("choices")) and (tokens_so_far is None or tokens_so_far > result.output_tokens)
                if carries:
                    if result.ttft is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                if usage:
                    result.prompt_tokens = usage["prompt_tokens"]
                    result.output_tokens = usage["completion_tokens"]
        result.latency = time.perf_counter() - start
        result.ok = result.output_tokens > 0 and result.ttft is not None
        if not result.ok:
            result.error = "no tokens in the response"
    except httpx.HTTPError as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


async def run_workload(args: argparse.Namespace, items: list[WorkItem]) -> tuple[list[RequestResult], float, str, float]:
    """Send the workload: each request's result, the run's duration, the model, and the run's start (unix time)."""
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
                result = await send_one(client, f"{base}/v1/completions", model, item, began=start)
            bar.update(1)
            return result

        start, started = time.perf_counter(), time.time()
        tasks = []
        for item in items:
            tasks.append(asyncio.create_task(limited(item)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return results, duration, model, started


PERCENTILES = (50, 90, 99)


def latency_stats(name: str, values: list[float]) -> dict[str, float]:
    """vLLM's keys: mean_/median_/std_/p50_/p90_/p99_{name}_ms (empty: zeros, reported with completed = 0)."""
    ordered = sorted(v * 1000 for v in values) or [0.0]
    out = {f"mean_{name}_ms": statistics.fmean(ordered), f"median_{name}_ms": statistics.median(ordered),
           f"std_{name}_ms": statistics.pstdev(ordered)}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]
    return out


def parse_goodput(specs: list[str] | None) -> dict[str, float]:
    slos = {}
    for spec in specs or []:
        name, _, value = spec.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not value:
            raise ValueError(f"--goodput {spec}: expected METRIC:MS with METRIC one of ttft, tpot, e2el")
        try:
            slos[name] = float(value) / 1000
        except ValueError:
            raise ValueError(f"--goodput {spec}: {value!r} is not a number of milliseconds") from None
    return slos


def tpot_of(r: RequestResult) -> float | None:
    return (r.latency - r.ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else None


def summarize(args: argparse.Namespace, results: list[RequestResult], duration: float, model: str,
              started: float | None = None) -> dict:
    ok = [r for r in results if r.ok]
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [t for t in map(tpot_of, ok) if t is not None]
    slos = parse_goodput(args.goodput)
    measured = lambda r: {"ttft": r.ttft, "tpot": tpot_of(r) or 0.0, "e2el": r.latency}  # noqa: E731
    good = [r for r in ok if all(measured(r)[name] <= limit for name, limit in slos.items())]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "started_unix_time": started,
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
        "duration": duration,
        "total_input_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "request_goodput": len(good) / duration if duration and slos else None,
        "goodput_slos_ms": {name: limit * 1000 for name, limit in slos.items()} or None,
        "output_throughput": output_tokens / duration if duration else 0.0,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration if duration else 0.0,
        **latency_stats("ttft", [r.ttft for r in ok]),
        **latency_stats("tpot", tpot),
        **latency_stats("itl", [x for r in ok for x in r.itl]),
        **latency_stats("e2el", [r.latency for r in ok]),
        "output_lens": [r.output_tokens for r in results],
        "ttfts": [r.ttft if r.ok else None for r in results],  # seconds, as vLLM writes them
        "itls": [r.itl for r in results],
        # Not vLLM's: when each request was sent (s since the run began), and its error; with the TTFTs and ITLs
        # they place every token in time (benchmarks/scripts/plot_failure.py).
        "start_times": [round(r.start, 4) for r in results],
        "request_errors": [r.error for r in results],
    }


def print_summary(summary: dict) -> None:
    print(f"{'completed / failed':<28}{summary['completed']} / {summary['failed']}")
    print(f"{'duration (s)':<28}{summary['duration']:.2f}")
    print(f"{'request throughput (req/s)':<28}{summary['request_throughput']:.2f}")
    if summary["request_goodput"] is not None:
        print(f"{'request goodput (req/s)':<28}{summary['request_goodput']:.2f}  (SLOs {summary['goodput_slos_ms']} ms)")
    print(f"{'output throughput (tok/s)':<28}{summary['output_throughput']:.1f}")
    print(f"{'total throughput (tok/s)':<28}{summary['total_token_throughput']:.1f}")
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")):
        print(f"{label + ' (ms)':<28}mean {summary[f'mean_{key}_ms']:.2f}  median {summary[f'median_{key}_ms']:.2f}  "
              f"p99 {summary[f'p99_{key}_ms']:.2f}")
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
    parse_goodput(args.goodput)  # a malformed SLO fails before any request is sent
    check_server(args)
    items = load_workload(args)
    results, duration, model, started = asyncio.run(run_workload(args, items))
    summary = summarize(args, results, duration, model, started)
    print_summary(summary)
    if args.save_result:
        with open(args.save_result, "w", encoding="utf-8") as f:
            json.dump({**summary, "args": {k: v for k, v in vars(args).items() if k != "func"}}, f, indent=2, default=str)
    return summary

