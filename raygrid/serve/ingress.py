"""OpenAIIngress: the Serve application's HTTP side (the ingress of Ray Serve LLM's split).

It holds what ``raygrid serve``'s API server holds (the OpenAI routes of entrypoints/openai_server.py,
tokenization, detokenization and streaming, in an AsyncLLM) except the engine: its AsyncLLM's engine client
reaches the EngineServer deployment's replicas through a Serve handle. Its metrics go to Ray's metrics
endpoint, labelled with this replica; the engines' gauges come from the engine replicas themselves.
"""

from __future__ import annotations

import weakref

from ray import serve

from raygrid.engine.async_llm import AsyncLLM
from raygrid.engine.gc_tuning import hold_serving_collector, release_serving_collector
from raygrid.entrypoints.openai_server import build_app
from raygrid.serve.config import LLMConfig, ServerOptions
from raygrid.serve.engine_client import ServeEngineClient
from raygrid.serve.ray_metrics import RayExporter


@serve.ingress()
class OpenAIIngress:
    def __init__(self, engine_handle, llm_config: LLMConfig | dict, server: ServerOptions | dict) -> None:
        llm_config = LLMConfig.model_validate(llm_config)
        self.server = ServerOptions.model_validate(server)
        # The ingress tokenizes and checks limits as the engine would: the same arguments, no device.
        args = llm_config.engine_args()
        kwargs = args.as_kwargs()
        engine = ServeEngineClient(engine_handle, max_migrations=args.max_migrations, migration_timeout_s=args.migration_timeout_s)
        self.llm = AsyncLLM(served_model_name=llm_config.model_id, max_queued_requests=self.server.max_queued_requests,
                            engine=engine, metrics_exporter=RayExporter(),
                            observe_scheduler=False, **kwargs)
        # The replica's process serves HTTP as `raygrid serve`'s API server does: its collector tuned the same way
        # (engine/gc_tuning.py), until this replica goes.
        hold_serving_collector()
        self._collector = weakref.finalize(self, release_serving_collector)

    def __serve_build_asgi_app__(self):
        s = self.server
        return build_app(self.llm, api_key=s.api_key, max_request_body_bytes=s.max_request_body_bytes,
                         body_read_timeout_s=s.body_read_timeout, metrics_without_auth=s.metrics_without_auth,
                         allowed_origins=s.allowed_origins, reasoning_parser=s.reasoning_parser,
                         tool_call_parser=s.tool_call_parser)

    def check_health(self) -> None:
        if not self.llm.is_healthy:
            raise RuntimeError("the ingress's engine loop stopped")

    def __del__(self) -> None:
        if hasattr(self, "llm"):  # not when __init__ failed
            self.llm.shutdown()
        if hasattr(self, "_collector"):
            self._collector()
