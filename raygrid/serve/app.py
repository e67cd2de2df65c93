"""``build_app(args)``: the Ray Serve application, as ``ray.serve.llm.build_openai_app`` builds one.

Two deployments: ``OpenAIIngress`` (HTTP, tokenization, streaming) and ``EngineServer`` (the engines). Each
EngineServer replica is one engine of tensor_parallel_size x pipeline_parallel_size, in a placement group
made from that grid; data parallelism is the number of replicas, fixed (``num_replicas``) or autoscaled on
requests in flight (``autoscaling_config``), behind Serve's router. Start it with
``serve run ray_configs/serve.yaml`` or ``raygrid serve --ray-serve``.
"""

from __future__ import annotations

import ray
from ray import serve
from ray.serve import Application

from raygrid.placement.placement import check_cluster_fits, replica_bundles, uses_gpu
from raygrid.serve.config import LLMConfig, ServeArgs
from raygrid.serve.engine_server import EngineServer
from raygrid.serve.ingress import OpenAIIngress


def engine_deployment_options(llm_config: LLMConfig) -> dict:
    """Serve options of the engine deployment: the grid's placement group, then the config's own options."""
    args = llm_config.engine_args()
    if not ray.is_initialized():
        ray.init(address=args.ray_address)
    grid, use_gpu = llm_config.grid(), uses_gpu(args.device)
    deployment = llm_config.deployment_config
    replicas = deployment.get("num_replicas", (deployment.get("autoscaling_config") or {}).get("min_replicas", 1))
    # A layout the cluster cannot hold fails here, naming what is missing, instead of pending in Serve.
    check_cluster_fits(grid, use_gpu, args.ray_worker_cpus, replicas if isinstance(replicas, int) else 1)
    bundles, strategy = replica_bundles(grid, use_gpu, args.ray_worker_cpus)
    options = {
        "placement_group_bundles": bundles,
        "placement_group_strategy": strategy,
        "ray_actor_options": {"num_cpus": bundles[0]["CPU"], "num_gpus": bundles[0].get("GPU", 0.0)},
        # Serve's default (5) would queue at the router what the engine's scheduler should batch.
        "max_ongoing_requests": 4 * args.max_num_seqs,
        # A lost engine is noticed within about three periods; the ingress retries its requests meanwhile.
        "health_check_period_s": 2.0,
    }
    options.update(llm_config.deployment_config)
    if llm_config.runtime_env:
        options["ray_actor_options"] = {**options["ray_actor_options"], "runtime_env": llm_config.runtime_env}
    return options


def build_app(args: ServeArgs | dict) -> Application:
    args = ServeArgs.model_validate(args)
    llm_config = args.llm_configs[0]
    drain = {"graceful_shutdown_timeout_s": args.server.drain_timeout_s}  # a deployment's own setting wins
    engines = serve.deployment(EngineServer, name="EngineServer", **{**drain, **engine_deployment_options(llm_config)})
    ingress_options = {"max_ongoing_requests": args.server.max_queued_requests, **drain, **args.ingress_deployment_config}
    ingress = serve.deployment(OpenAIIngress, name="OpenAIIngress", **ingress_options)
    config = llm_config.model_dump()
    return ingress.bind(engines.bind(config), config, args.server.model_dump())


build_openai_app = build_app  # Ray Serve LLM's name for it
