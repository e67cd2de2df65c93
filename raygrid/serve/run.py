"""``raygrid serve --ray-serve``: the Serve application from ``raygrid serve``'s own flags.

The engine flags become the LLMConfig's ``engine_kwargs`` (those that differ from their defaults),
``--data-parallel-size`` the engine deployment's ``num_replicas``, the HTTP flags the ingress's
ServerOptions; ``--host`` and ``--port`` are Serve's HTTP proxy's. It joins ``--ray-address`` (or starts a
local Ray) and serves until SIGINT or SIGTERM, then deletes the application.
"""

from __future__ import annotations

import argparse
import signal
import threading

from raygrid.engine.arg_utils import EngineArgs
from raygrid.serve.config import LLMConfig, ServeArgs, ServerOptions

APP_NAME = "raygrid"
# `raygrid serve` flags that have no meaning behind Serve's proxy, with their defaults.
_NOT_WITH_RAY_SERVE = {"api_server_count": 1, "engine_in_process": False, "header_read_timeout": 30.0}


def serve_args_from_cli(args: argparse.Namespace, engine_kwargs: dict) -> ServeArgs:
    for flag, default in _NOT_WITH_RAY_SERVE.items():
        if getattr(args, flag) != default:
            raise ValueError(f"--{flag.replace('_', '-')}: not available with --ray-serve (Serve's proxy and replicas take its place)")
    defaults = EngineArgs().as_kwargs()
    kwargs = {k: v for k, v in engine_kwargs.items() if v != defaults[k]}
    model = kwargs.pop("model", defaults["model"])
    # DP is Serve replicas; under expert parallelism the DP ranks are one world, inside one replica.
    replicas = 1 if kwargs.get("enable_expert_parallel") else kwargs.pop("data_parallel_size", 1)
    kwargs.pop("ray_address", None)
    kwargs.pop("distributed_executor_backend", None)
    streaming = {} if args.stream_messages_per_s is None else {"stream_messages_per_s": args.stream_messages_per_s}
    llm_config = LLMConfig(model_loading_config={"model_id": args.served_model_name or model, "model_source": model},
                           engine_kwargs=kwargs, deployment_config={"num_replicas": replicas}, **streaming)
    server = ServerOptions(**{name: getattr(args, name) for name in ServerOptions.model_fields})
    return ServeArgs(llm_configs=[llm_config], server=server)


def run_serve_app(args: argparse.Namespace, engine_kwargs: dict) -> int:
    import ray
    from ray import serve

    from raygrid.serve.app import build_app

    serve_args = serve_args_from_cli(args, engine_kwargs)
    address = engine_kwargs.get("ray_address")
    local = address is None  # a Ray of our own, to stop at the end; a cluster joined keeps its Serve
    ray.init(address=address, log_to_driver=False)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(build_app(serve_args), name=APP_NAME, route_prefix="/",
                  logging_config={"log_level": args.log_level.upper()})
        print(f"raygrid: serving {serve_args.llm_configs[0].model_id} through Ray Serve at "
              f"http://{args.host}:{args.port}/v1 (Ctrl-C stops)", flush=True)
        stop.wait()
    finally:
        serve.delete(APP_NAME)
        if local:
            serve.shutdown()
        ray.shutdown()
    return 0
