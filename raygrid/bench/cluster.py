"""``raygrid bench cluster --config SWEEP.yaml``: the multi-node benchmark run, made as a Ray job
(``ray job submit --working-dir . -- raygrid bench cluster --config ...``) on the cluster it is submitted to.

For each layout (TP x PP x DP) of the config it measures:
- offline throughput (``LLM.generate`` on a fixed workload), with each worker's own step time (its mean
  time from taking a step to its tokens on the host: ``Worker.step_report``);
- online latency through the Serve application (``raygrid.serve.build_app``, DP = Serve replicas) at each
  request rate: TTFT, ITL and end-to-end percentiles, as ``raygrid bench serve`` measures them.
It writes ``report.json``, three PNG plots (matplotlib) and ``summary.md`` embedding them, into ``--output-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import time
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from raygrid.engine.arg_utils import check_engine_kwargs

# Engine arguments a sweep's engine_kwargs may not hold: the sweep sets them itself.
_SET_BY_THE_SWEEP = {"model": "the config's model names it", "tensor_parallel_size": "the layouts set it",
                     "pipeline_parallel_size": "the layouts set it", "data_parallel_size": "the layouts set it",
                     "distributed_executor_backend": "every layout runs on Ray"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OfflineLoad(_Strict):
    num_prompts: int = Field(default=256, ge=1)
    input_len: int = Field(default=512, ge=1)
    output_len: int = Field(default=128, ge=1)


class OnlineLoad(OfflineLoad):
    request_rates: list[float] = Field(default_factory=lambda: [4.0, 16.0, math.inf], min_length=1)


class ClusterBenchConfig(_Strict):
    model: str
    engine_kwargs: dict = Field(default_factory=dict)
    layouts: list[str] = Field(min_length=1, description="TPxPPxDP, e.g. 2x1x2")
    offline: OfflineLoad = Field(default_factory=OfflineLoad)
    online: OnlineLoad | None = Field(default_factory=OnlineLoad)
    http_port: int = 8000

    @field_validator("layouts")
    @classmethod
    def _layouts(cls, layouts: list[str]) -> list[str]:
        for layout in layouts:
            parse_layout(layout)
        return layouts

    @field_validator("engine_kwargs")
    @classmethod
    def _engine_kwargs(cls, kwargs: dict) -> dict:
        check_engine_kwargs(kwargs, _SET_BY_THE_SWEEP, "in a sweep")
        return kwargs


def parse_layout(layout: str) -> tuple[int, int, int]:
    parts = layout.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"layouts: {layout!r} is not TPxPPxDP (three positive integers, e.g. 2x1x2)")
    tp, pp, dp = map(int, parts)
    return tp, pp, dp


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="the sweep: YAML with model, engine_kwargs, layouts, offline, online")
    parser.add_argument("--output-dir", default="cluster-report", help="where report.json, the plots and summary.md go")
    parser.add_argument("--ray-address", default=None, help="the cluster (default: RAY_ADDRESS, as under `ray job submit`, "
                                                             "or a local one)")


def load_config(path: str) -> ClusterBenchConfig:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as error:
        raise ValueError(f"--config {path}: {error.strerror}") from None
    return ClusterBenchConfig.model_validate(raw)


# ---------------------------------------------------------------------- measuring


def measure_offline(config: ClusterBenchConfig, tp: int, pp: int, dp: int) -> dict:
    from raygrid import LLM, SamplingParams
    from raygrid.bench.throughput import make_workload

    load = config.offline
    llm = LLM(model=config.model, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=dp,
              distributed_executor_backend="ray", **config.engine_kwargs)
    try:
        prompts, output_lens = make_workload(load.num_prompts, load.input_len, load.output_len, None, 0,
                                             llm.processor.vocab_size)
        llm.generate([{"prompt_token_ids": p[:8]} for p in prompts[:4]],
                     SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False), use_tqdm=False)  # warm up
        params = [SamplingParams(max_tokens=n, ignore_eos=True, detokenize=False) for n in output_lens]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        ranks = llm.engine.collective_rpc("step_report")  # per replica, per rank
    finally:
        llm.shutdown()
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"elapsed_s": elapsed, "output_tokens": generated, "output_throughput": generated / elapsed,
            "requests_per_s": len(outputs) / elapsed,
            "ranks": [dict(report, replica=i) for i, replica in enumerate(ranks) for report in replica]}


def measure_online(config: ClusterBenchConfig, tp: int, pp: int, dp: int) -> list[dict]:
    from ray import serve

    from raygrid.bench.serve import load_workload, run_workload, summarize
    from raygrid.serve import build_app

    load = config.online
    app = build_app({"llm_config": {
        "model_loading_config": {"model_id": "bench", "model_source": config.model},
        "engine_kwargs": {**config.engine_kwargs, "tensor_parallel_size": tp, "pipeline_parallel_size": pp},
        "deployment_config": {"num_replicas": dp}}})
    serve.start(http_options={"host": "127.0.0.1", "port": config.http_port})
    serve.run(app, name="raygrid-bench", route_prefix="/")
    results = []
    try:
        for rate in load.request_rates:
            args = argparse.Namespace(base_url=f"http://127.0.0.1:{config.http_port}", model="bench", api_key=None,
                                      num_prompts=load.num_prompts, request_rate=rate, max_concurrency=None,
                                      dataset="random", input_len=load.input_len, output_len=load.output_len,
                                      token_id_range=[10, 1000], seed=0, goodput=None, no_progress=True)
            outcome, duration, model, started = asyncio.run(run_workload(args, load_workload(args)))
            summary = summarize(args, outcome, duration, model, started)
            results.append({key: value for key, value in summary.items() if key not in ("output_lens", "ttfts")})
    finally:
        serve.delete("raygrid-bench")
    return results


def run_cluster_benchmark(args: argparse.Namespace) -> dict:
    import ray

    from raygrid.bench.throughput import device_name, git_commit

    config = load_config(args.config)
    if not ray.is_initialized():
        ray.init(address=args.ray_address or os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "commit": git_commit(), "machine": platform.node(), "device": device_name(),
              "cluster": {"nodes": len([n for n in ray.nodes() if n["Alive"]]), "resources": ray.cluster_resources()},
              "config": json.loads(config.model_dump_json()), "layouts": []}
    for layout in config.layouts:
        tp, pp, dp = parse_layout(layout)
        print(f"raygrid bench cluster: layout {layout}: offline", flush=True)
        entry = {"layout": layout, "tp": tp, "pp": pp, "dp": dp, "offline": measure_offline(config, tp, pp, dp)}
        print(f"  {entry['offline']['output_throughput']:.1f} output tok/s", flush=True)
        if config.online is not None:
            print(f"raygrid bench cluster: layout {layout}: online at {config.online.request_rates} req/s", flush=True)
            entry["online"] = measure_online(config, tp, pp, dp)
        report["layouts"].append(entry)
    paths = write_report(report, Path(args.output_dir))
    print(f"raygrid bench cluster: wrote {', '.join(str(p) for p in paths)}", flush=True)
    return report


# ---------------------------------------------------------------------- the report


def write_report(report: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    layouts = report["layouts"]
    names = [entry["layout"] for entry in layouts]

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, [entry["offline"]["output_throughput"] for entry in layouts], color="tab:blue")
    ax.set(title="Offline output throughput by layout (TPxPPxDP)", xlabel="layout", ylabel="output tokens/s")
    fig.tight_layout()
    fig.savefig(out / "throughput_by_layout.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for entry in layouts:
        online = entry.get("online") or []
        rates = [_rate_label(r["request_rate"]) for r in online]
        for ax, key, title in zip(axes, ("ttft", "itl", "e2el"), ("TTFT", "ITL", "End-to-end latency")):
            for p, style in ((50, "-o"), (99, "--x")):
                ax.plot(rates, [r[f"p{p}_{key}_ms"] for r in online], style, label=f"{entry['layout']} p{p}")
            ax.set(title=f"{title} against request rate", xlabel="requests/s", ylabel="ms")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "latency_by_rate.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 4))
    labels, values = [], []
    for entry in layouts:
        for rank in entry["offline"]["ranks"]:
            labels.append(f"{entry['layout']}\nr{rank['replica']}.{rank['rank']}")
            values.append(rank["mean_execute_s"] * 1000)
    ax.bar(labels, values, color="tab:green")
    ax.set(title="Mean step time per rank (replica.rank), as each worker reports it", ylabel="ms")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "step_time_by_rank.png", dpi=120)
    plt.close(fig)

    (out / "summary.md").write_text(summary_markdown(report))
    return [out / name for name in ("report.json", "throughput_by_layout.png", "latency_by_rate.png",
                                    "step_time_by_rank.png", "summary.md")]


def _rate_label(rate: float) -> str:
    return "all at once" if math.isinf(rate) else f"{rate:g}"


def summary_markdown(report: dict) -> str:
    config = report["config"]
    lines = [
        f"# raygrid cluster benchmark, {report['date']}",
        "",
        f"Commit {report['commit']}, {report['cluster']['nodes']} node(s) ({report['device']} on the driver's node); "
        f"model `{config['model']}`; offline {config['offline']['num_prompts']} requests of "
        f"{config['offline']['input_len']}/{config['offline']['output_len']} tokens.",
        "",
        "| layout (TPxPPxDP) | offline output tok/s | mean step per rank (ms) |",
        "| --- | ---: | --- |",
    ]
    for entry in report["layouts"]:
        ranks = ", ".join(f"{r['mean_execute_s'] * 1000:.2f}" for r in entry["offline"]["ranks"])
        lines.append(f"| {entry['layout']} | {entry['offline']['output_throughput']:.1f} | {ranks} |")
    lines += ["", "![throughput by layout](throughput_by_layout.png)", ""]
    if any(entry.get("online") for entry in report["layouts"]):
        lines += ["## Online, through the Serve application", "",
                  "| layout | requests/s | completed | output tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | E2E p50 / p99 (ms) |",
                  "| --- | --- | ---: | ---: | --- | --- | --- |"]
        for entry in report["layouts"]:
            for r in entry.get("online") or []:
                lines.append(f"| {entry['layout']} | {_rate_label(r['request_rate'])} | {r['completed']}/{r['num_prompts']} | "
                             f"{r['output_throughput']:.1f} | {r['p50_ttft_ms']:.1f} / {r['p99_ttft_ms']:.1f} | "
                             f"{r['p50_itl_ms']:.1f} / {r['p99_itl_ms']:.1f} | {r['p50_e2el_ms']:.1f} / {r['p99_e2el_ms']:.1f} |")
        lines += ["", "![latency by request rate](latency_by_rate.png)", ""]
    lines += ["![step time by rank](step_time_by_rank.png)", ""]
    return "\n".join(lines)
