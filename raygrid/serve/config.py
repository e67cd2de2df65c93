"""The Serve application's configuration, in Ray Serve LLM's shape (``ray.serve.llm.LLMConfig``).

``LLMConfig`` names the model (``model_loading_config``), the engine's arguments (``engine_kwargs``: the
fields of ``EngineArgs``, checked here so that a typo fails ``serve run`` rather than a replica) and the
engine deployment's Serve options (``deployment_config``: ``num_replicas`` or ``autoscaling_config``,
``max_ongoing_requests``, health checks). ``ServeArgs`` adds the ingress: its deployment options and the
HTTP server's (API key, parsers, limits). Data parallelism is Serve replicas, so ``data_parallel_size`` is
not an engine argument here; each replica is one engine of tensor_parallel_size x pipeline_parallel_size.
Under expert parallelism it is: the DP ranks that share the experts are one world, so one Serve replica holds
all of them (``data_parallel_size`` x TP x PP workers) and fails, restarts and is routed to as one.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raygrid.engine.arg_utils import EngineArgs, check_engine_kwargs
from raygrid.parallel.rank_grid import RankGrid

# Set by the replica itself: Serve places it, and Serve replicas are the data-parallel copies.
_NOT_UNDER_SERVE = {"model": "model_loading_config names it",
                    "data_parallel_size": "use the deployment's num_replicas or autoscaling_config",
                    "distributed_executor_backend": "each replica picks its own", "ray_address": "the replica runs on Serve's cluster"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelLoadingConfig(_Strict):
    model_id: str = Field(description="the model name clients send (the OpenAI 'model' field)")
    model_source: str | None = Field(default=None, description="checkpoint directory or built-in name (default: model_id)")


class LLMConfig(_Strict):
    model_loading_config: ModelLoadingConfig
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    deployment_config: dict[str, Any] = Field(default_factory=dict)
    runtime_env: dict[str, Any] | None = None
    stream_messages_per_s: float = Field(
        default=1000.0, gt=0,
        description="messages a second an engine replica streams to the ingress, all requests together: with more "
                    "requests in flight than that allows each step, a request's tokens are sent several steps at a time")

    @field_validator("engine_kwargs")
    @classmethod
    def _known_engine_args(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        refused = dict(_NOT_UNDER_SERVE)
        if kwargs.get("enable_expert_parallel"):
            del refused["data_parallel_size"]  # the DP ranks of one expert-parallel world: inside one replica
        check_engine_kwargs(kwargs, refused, "under Serve")
        return kwargs

    @property
    def model_id(self) -> str:
        return self.model_loading_config.model_id

    @property
    def model_source(self) -> str:
        return self.model_loading_config.model_source or self.model_loading_config.model_id

    def engine_args(self) -> EngineArgs:
        """One replica's engine: everything given, on Ray when it has more than one worker."""
        args = EngineArgs(model=self.model_source, **self.engine_kwargs)
        if args.parallel_config().replica_grid().world_size > 1:
            args.distributed_executor_backend = "ray"
        return args

    def grid(self) -> RankGrid:
        """One replica's workers: TP x PP, times DP under expert parallelism."""
        return self.engine_args().parallel_config().replica_grid()

    def uses_workers(self) -> bool:
        """Several ranks run as Ray worker actors in the replica's placement group; one runs in an engine
        process of the replica's own."""
        return self.grid().world_size > 1


class ServerOptions(_Strict):
    """The HTTP side, as ``raygrid serve``'s flags of the same names."""

    api_key: str | None = None
    metrics_without_auth: bool = False
    max_request_body_bytes: int = Field(default=8 * 2**20, gt=0)
    body_read_timeout: float = Field(default=30.0, gt=0)
    allowed_origins: list[str] | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    max_queued_requests: int = Field(default=4096, ge=1)
    drain_timeout_s: float = Field(default=30.0, gt=0, description="a replica being stopped finishes its requests in "
                                                                   "flight for this long (Serve's graceful_shutdown_timeout_s)")


class ServeArgs(_Strict):
    """``build_app``'s argument: ``serve run``'s ``args:`` block, or ``raygrid serve --ray-serve``'s flags."""

    llm_configs: list[LLMConfig] = Field(min_length=1)
    ingress_deployment_config: dict[str, Any] = Field(default_factory=dict)
    server: ServerOptions = Field(default_factory=ServerOptions)

    @model_validator(mode="before")
    @classmethod
    def _one_config(cls, data: Any) -> Any:
        if isinstance(data, dict) and "llm_config" in data:  # one model: the singular spelling
            data = dict(data)
            data["llm_configs"] = [data.pop("llm_config")]
        return data

    @field_validator("llm_configs")
    @classmethod
    def _one_model(cls, configs: list[LLMConfig]) -> list[LLMConfig]:
        if len(configs) > 1:
            raise ValueError(f"llm_configs: an application serves one model (got {len(configs)}); "
                             "deploy one application per model")
        return configs
