"""`raygrid serve`: API server processes in front of one engine.

With ``--api-server-count 1`` (the default) this process is the API server, and its AsyncLLM starts the
engine process (or, with ``--engine-in-process``, steps the engine on a thread). With N > 1, as vLLM's
``--api-server-count``, this process is a supervisor: it binds the port, starts the engine process and N
API server processes that accept connections on the one listening socket, each a client of the engine.
Tokenization, detokenization and streaming then spread over N interpreters. /metrics stays whole through
prometheus-client's multiprocess mode. If any of the processes exits, the supervisor stops the others.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time

from raygrid.engine.gc_tuning import hold_serving_collector, release_serving_collector
from raygrid.models.default_model import DEFAULT_MODEL_NAME


def bind_port(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ValueError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(args: argparse.Namespace, engine_kwargs: dict) -> int:
    if args.api_server_count < 1:
        raise ValueError(f"--api-server-count: must be >= 1 (got {args.api_server_count})")
    if args.api_server_count > 1 and args.engine_in_process:
        raise ValueError("--api-server-count: several API servers need the engine in a process of its own (drop --engine-in-process)")
    if args.model == DEFAULT_MODEL_NAME:
        print(f"note: {DEFAULT_MODEL_NAME} has random weights; its text is noise, the engine around it is real.", file=sys.stderr)
    sock = bind_port(args.host, args.port)  # before the model loads: a taken port fails at once
    try:
        if args.api_server_count == 1:
            return serve_http(args, engine_kwargs, sock)
        return _supervise(args, engine_kwargs, sock)
    finally:
        sock.close()


def serve_http(args: argparse.Namespace, engine_kwargs: dict, sock: socket.socket, connection=None) -> int:
    """One API server: an AsyncLLM and uvicorn on ``sock`` until SIGINT or SIGTERM."""
    import uvicorn

    from raygrid.engine.async_llm import AsyncLLM
    from raygrid.entrypoints.http_guards import header_timeout_protocol
    from raygrid.entrypoints.openai_server import build_app

    engine = AsyncLLM(served_model_name=args.served_model_name, max_queued_requests=args.max_queued_requests,
                      engine_process=not args.engine_in_process, engine_connection=connection,
                      observe_scheduler=connection is None or connection.index == 0, **engine_kwargs)
    try:
        app = build_app(engine, api_key=args.api_key, max_request_body_bytes=args.max_request_body_bytes,
                        body_read_timeout_s=args.body_read_timeout, metrics_without_auth=args.metrics_without_auth,
                        allowed_origins=args.allowed_origins, reasoning_parser=args.reasoning_parser,
                        tool_call_parser=args.tool_call_parser)
        # SIGTERM drains: uvicorn stops listening, lets the responses in flight finish for up to drain_timeout_s,
        # then cancels the rest (their requests are aborted in the engine).
        server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=args.drain_timeout_s,
                                               http=header_timeout_protocol(args.header_read_timeout)))
        # uvicorn raises the signal again once it has drained, under the handlers it found: these let this
        # function go on to shut the engine down and return, instead of the process dying there.
        previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGINT, signal.SIGTERM)} \
            if threading.current_thread() is threading.main_thread() else {}
        try:
            with collector_for_serving():
                server.run(sockets=[sock])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        engine.shutdown()
    return 0


@contextlib.contextmanager
def collector_for_serving():
    """The garbage collector tuned while this process serves HTTP (engine/gc_tuning.py): startup's objects frozen,
    full collections deferred. Under 2,000 requests on an H200 every /health probe over 50 ms had begun with one
    of the API server's full collections (benchmarks/README.md, "`/health` under full load")."""
    hold_serving_collector()
    try:
        yield
    finally:
        release_serving_collector()


def _drained(_signum, _frame) -> None:
    """The signal uvicorn raises again after its drain: serving is over, which the caller already knows."""


def _api_server_main(args: argparse.Namespace, engine_kwargs: dict, sock: socket.socket, connection) -> None:
    """An API server process of the supervisor's (spawned: a fresh interpreter)."""
    from raygrid.entrypoints.cli import describe_error

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when serving ends (SIGTERM)
    try:
        serve_http(args, engine_kwargs, sock, connection)
    except (ValueError, RuntimeError, TimeoutError) as error:
        print(f"API server {connection.index}: {describe_error(error)}", file=sys.stderr)
        sys.exit(2)


def _supervise(args: argparse.Namespace, engine_kwargs: dict, sock: socket.socket) -> int:
    from raygrid.engine.core_proc import EngineProc
    from raygrid.engine.input_processor import InputProcessor, build_engine_config

    metrics_dir = tempfile.mkdtemp(prefix="raygrid-metrics-")
    # Read by prometheus-client when the API servers import it: their values go to files there.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    config = build_engine_config(**engine_kwargs)
    processor = InputProcessor(config)
    engine = EngineProc(config, processor.eos_token_ids, num_clients=args.api_server_count, grammars=processor.grammars)
    spawn = multiprocessing.get_context("spawn")
    servers = [spawn.Process(target=_api_server_main, args=(args, engine_kwargs, sock, connection),
                             name=f"raygrid-api-server-{connection.index}")
               for connection in engine.connections]
    stopping = False

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for server in servers:
            server.start()
        print(f"raygrid: {len(servers)} API servers (pids {', '.join(str(s.pid) for s in servers)}) and the engine "
              f"process (pid {engine.process.pid})", file=sys.stderr, flush=True)
        while not stopping:
            exited = [p for p in (*servers, engine.process) if not p.is_alive()]
            if exited:
                print(f"raygrid: {exited[0].name} exited (code {exited[0].exitcode}); stopping the others", file=sys.stderr)
                break
            time.sleep(0.2)
    finally:
        for server in servers:
            if server.is_alive():
                server.terminate()  # uvicorn finishes the responses in flight, then exits
        for server in servers:
            server.join(timeout=args.drain_timeout_s + 10)
            if server.is_alive():
                server.kill()
                server.join(timeout=5)
        engine.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0 if stopping else 1
