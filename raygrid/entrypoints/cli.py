"""The ``raygrid`` command: ``raygrid generate``, ``serve``, ``bench serve / throughput / latency / parallel / cluster /
allreduce``. The engine's flags come from ``EngineArgs``."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from raygrid.engine.arg_utils import EngineArgs
from raygrid.entrypoints.reasoning import REASONING_PARSERS
from raygrid.entrypoints.tool_calls import TOOL_CALL_PARSERS
from raygrid.models.default_model import DEFAULT_MODEL_NAME
from raygrid.validation import InvalidArgument


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    EngineArgs.add_cli_args(parser)


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The engine's arguments from the flags, their own limits checked before torch or a checkpoint loads."""
    engine_args = EngineArgs.from_cli_args(args)
    engine_args.check()
    return engine_args.as_kwargs()


def cmd_generate(args: argparse.Namespace) -> int:
    from raygrid.engine.sampling_params import SamplingParams  # no torch: a bad value is reported at once

    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
        stop=args.stop,
        n=args.n,
    )
    kwargs = engine_kwargs(args)
    if args.model == DEFAULT_MODEL_NAME:
        print(f"note: {DEFAULT_MODEL_NAME} has random weights; its text is noise, the engine around it is real.", file=sys.stderr)
    from raygrid import LLM

    llm = LLM(**kwargs)
    outputs = llm.generate(args.prompt, params, use_tqdm=False)
    for output in outputs:
        if output.error:
            print(f"error: {output.error}", file=sys.stderr)
            return 2
        print(f"prompt: {output.prompt!r}")
        for completion in output.outputs:
            print(f"[{completion.index}] {completion.text!r}  ({len(completion.token_ids)} tokens, finish_reason={completion.finish_reason})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from raygrid.entrypoints.api_server import run_server

    if args.model_tag is not None:  # `raygrid serve MODEL`, as `vllm serve MODEL`
        if args.model not in (DEFAULT_MODEL_NAME, args.model_tag):
            raise ValueError(f"the model is given twice, as {args.model_tag!r} and --model {args.model!r}: give it once")
        args.model = args.model_tag
    if args.ray_serve:
        from raygrid.serve.run import run_serve_app

        return run_serve_app(args, engine_kwargs(args))
    if args.stream_messages_per_s is not None:
        raise ValueError("--stream-messages-per-s: only with --ray-serve (it paces the engine replicas' streams)")
    return run_server(args, engine_kwargs(args))


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from raygrid.bench.serve import run_serve_benchmark

    run_serve_benchmark(args)
    return 0


def cmd_bench_throughput(args: argparse.Namespace) -> int:
    from raygrid.bench.throughput import run_throughput_benchmark

    run_throughput_benchmark(args, engine_kwargs(args))
    return 0


def cmd_bench_latency(args: argparse.Namespace) -> int:
    from raygrid.bench.latency import run_latency_benchmark

    run_latency_benchmark(args, engine_kwargs(args))
    return 0


def cmd_bench_cluster(args: argparse.Namespace) -> int:
    from raygrid.bench.cluster import run_cluster_benchmark

    run_cluster_benchmark(args)
    return 0


def cmd_bench_parallel(args: argparse.Namespace) -> int:
    from raygrid.bench.parallel_check import run_parallel_check

    kwargs = engine_kwargs(args)
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "distributed_executor_backend"):
        kwargs.pop(key)
    run_parallel_check(args, kwargs)
    return 0


def cmd_bench_allreduce(args: argparse.Namespace) -> int:
    from raygrid.bench.allreduce import run_allreduce_benchmark

    run_allreduce_benchmark(args)
    return 0


def cmd_dashboards(args: argparse.Namespace) -> int:
    import json

    if args.action == "push" and not args.grafana_url:
        raise ValueError("dashboards push needs --grafana-url (Grafana's base URL, e.g. http://grafana:3000)")
    try:
        from raygrid.observability import dashboard

        if args.action == "push":
            answer = dashboard.push(args.grafana_url, api_key=args.api_key, folder_uid=args.folder_uid)
        else:
            text = json.dumps(dashboard.export_json(), indent=2)
    except ImportError as error:
        raise ValueError(f"raygrid dashboards needs its extra: pip install 'raygrid[dashboards]' ({error})") from None
    if args.action == "push":
        print(f"raygrid: dashboard {answer.get('uid')} pushed (version {answer.get('version')}): {answer.get('url')}")
    elif args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        print(f"raygrid: wrote the dashboard to {args.output}")
    else:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raygrid", description="raygrid LLM inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete prompts offline and print the results")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for a batch")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=None)
    gen.add_argument("-n", type=int, default=1)
    gen.set_defaults(func=cmd_generate)

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    serve.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="the model, as `vllm serve MODEL` (or --model)")
    add_engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every route but /health")
    serve.add_argument("--metrics-without-auth", action="store_true", help="leave /metrics open for scrapers that carry no key")
    serve.add_argument("--max-request-body-bytes", type=int, default=8 * 2**20, help="larger bodies get 413 before they are parsed")
    serve.add_argument("--body-read-timeout", type=float, default=30.0, help="seconds to wait for each part of a request body (408 after)")
    serve.add_argument("--header-read-timeout", type=float, default=30.0, help="seconds a connection may take to send a request's headers")
    serve.add_argument("--allowed-origins", action="append", default=None,
                       help="let browsers on this origin call the API (CORS); repeat for several, '*' for any")
    serve.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                       help="split the chat reply's thinking (<think>...</think>) into reasoning_content")
    serve.add_argument("--tool-call-parser", default=None, choices=TOOL_CALL_PARSERS,
                       help="read tool calls out of chat replies (hermes: <tool_call>{json}</tool_call>, as Qwen3 writes "
                            "them); needed for tool_choice 'auto'")
    serve.add_argument("--served-model-name", default=None, help="the model name clients use (default: --model)")
    serve.add_argument("--max-queued-requests", type=int, default=4096, help="sequences in flight before new requests get 503")
    serve.add_argument("--drain-timeout-s", type=float, default=30.0,
                       help="on SIGTERM: seconds to finish the requests in flight, taking no new ones, before exiting "
                            "(under --ray-serve: each replica's graceful shutdown)")
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--engine-in-process", action="store_true",
                       help="run the step loop on a thread of the API process instead of a process of its own")
    serve.add_argument("--api-server-count", type=int, default=1,
                       help="API server processes sharing the port and the engine (HTTP, tokenization and streaming spread over them)")
    serve.add_argument("--ray-serve", action="store_true",
                       help="run as a Ray Serve application (raygrid.serve.build_app): an ingress and one engine deployment "
                            "whose replicas are the data-parallel copies")
    serve.add_argument("--stream-messages-per-s", type=float, default=None,
                       help="with --ray-serve: messages a second each engine replica streams to the ingress, all requests "
                            "together (default 1000); under heavier load a request's tokens go several steps at a time")
    serve.set_defaults(func=cmd_serve)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    from raygrid.bench.serve import add_serve_bench_args

    bench_serve = bench.add_parser("serve", help="load an OpenAI-compatible endpoint and measure latency and throughput")
    add_serve_bench_args(bench_serve)
    bench_serve.set_defaults(func=cmd_bench_serve)

    from raygrid.bench.parallel_check import add_parallel_args
    from raygrid.bench.throughput import add_throughput_args

    bench_tp = bench.add_parser("throughput", help="offline throughput of raygrid or transformers on the same prompts")
    add_engine_args(bench_tp)
    add_throughput_args(bench_tp)
    bench_tp.set_defaults(func=cmd_bench_throughput)

    from raygrid.bench.latency import add_latency_args

    bench_lat = bench.add_parser("latency", help="time to first token and per output token of a lone batch, by prompt length "
                                                 "(raygrid or transformers)")
    add_engine_args(bench_lat)
    add_latency_args(bench_lat)
    bench_lat.set_defaults(func=cmd_bench_latency)

    bench_par = bench.add_parser("parallel", help="the same greedy requests under several TPxPP layouts: match and timing")
    add_engine_args(bench_par)
    add_parallel_args(bench_par)
    bench_par.set_defaults(func=cmd_bench_parallel)

    from raygrid.bench.cluster import add_cluster_args

    bench_cluster = bench.add_parser("cluster", help="sweep layouts (TPxPPxDP) and request rates on a Ray cluster "
                                                     "(a `ray job submit` run): JSON, PNG plots and a Markdown summary")
    add_cluster_args(bench_cluster)
    bench_cluster.set_defaults(func=cmd_bench_cluster)

    from raygrid.bench.allreduce import add_allreduce_args

    bench_ar = bench.add_parser("allreduce", help="the custom all-reduce against NCCL and torch's symmetric-memory kernels, "
                                                  "eager and in CUDA graphs, every result checked (GPUs of one node)")
    add_allreduce_args(bench_ar)
    bench_ar.set_defaults(func=cmd_bench_allreduce)

    boards = sub.add_parser("dashboards", help="raygrid's Grafana dashboard: export its JSON, or push it to a Grafana")
    boards.add_argument("action", choices=["export", "push"])
    boards.add_argument("--output", "-o", default=None, help="export: the file to write (default: standard output)")
    boards.add_argument("--grafana-url", default=None, help="push: Grafana's base URL")
    boards.add_argument("--api-key", default=os.environ.get("GRAFANA_API_KEY"),
                        help="push: a Grafana service-account token (default: $GRAFANA_API_KEY)")
    boards.add_argument("--folder-uid", default=None, help="push: the Grafana folder to put it in")
    boards.set_defaults(func=cmd_dashboards)
    return parser


def describe_error(error: Exception) -> str:
    """One line per problem, naming the flag: '--temperature: must be >= 0.0 (got -1.0)'."""
    if isinstance(error, ValidationError):
        error = InvalidArgument.from_pydantic(error)
    if not isinstance(error, InvalidArgument):
        return f"error: {error}"
    return "\n".join(f"error: {flag(field)}: {message}" if field else f"error: {message}" for field, message in error.problems)


def flag(field: str) -> str:
    """An argument's flag: 'max_num_seqs' -> '--max-num-seqs'; 'eplb_config.window_size' -> '--eplb-config window_size'."""
    name, _, inner = field.partition(".")
    return f"--{name.replace('_', '-')}" + (f" {inner}" if inner else "")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as error:  # pydantic's ValidationError is a ValueError
        print(describe_error(error), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
