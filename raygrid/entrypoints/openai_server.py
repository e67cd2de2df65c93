"""OpenAI-compatible HTTP server (FastAPI) over AsyncLLM: the app, its middleware and error handlers, and its routes.

POST /v1/completions (serving_completions.py) and /v1/chat/completions (serving_chat.py), streamed as
server-sent events or not; GET /v1/models, /health, /version and /metrics (Prometheus); the utility routes
(utility_routes.py). Every client error gets the OpenAI error body with a 4xx status; the engine keeps serving
the others.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

import raygrid
from raygrid.engine.async_llm import AsyncLLM
from raygrid.entrypoints.http_guards import ApiKeyGuard, BodyGuard, FairAdmission, RequestIdHeader, error_response
from raygrid.entrypoints.openai_protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from raygrid.entrypoints.serving_base import APIError, describe_validation_error
from raygrid.entrypoints.serving_chat import ChatServing
from raygrid.entrypoints.serving_completions import CompletionServing
from raygrid.entrypoints.utility_routes import utility_router

logger = logging.getLogger(__name__)


def build_app(engine: AsyncLLM, api_key: str | None = None, served_model_names: list[str] | None = None,
              max_request_body_bytes: int = 8 * 2**20, body_read_timeout_s: float = 30.0,
              metrics_without_auth: bool = False, allowed_origins: list[str] | None = None,
              reasoning_parser: str | None = None, tool_call_parser: str | None = None) -> FastAPI:
    names = served_model_names or [engine.model_name]
    max_len = engine.config.model.max_model_len
    completion_serving = CompletionServing(engine, names)
    chat_serving = ChatServing(engine, names, reasoning_parser, tool_call_parser)
    app = FastAPI(title="raygrid OpenAI-compatible server", version=raygrid.__version__)
    app.add_middleware(FairAdmission)  # innermost: a request's turn starts once its body is whole
    app.add_middleware(BodyGuard, max_bytes=max_request_body_bytes, read_timeout_s=body_read_timeout_s)
    app.add_middleware(RequestIdHeader)
    if api_key:  # added last, so it runs first: no body is read for a request without the key
        open_paths = frozenset({"/health", "/metrics"} if metrics_without_auth else {"/health"})
        app.add_middleware(ApiKeyGuard, api_key=api_key, open_paths=open_paths)
    if allowed_origins:  # outermost: a browser's preflight OPTIONS carries no key
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"], allow_headers=["*"],
                           allow_credentials=True, expose_headers=["x-request-id"])

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_request, error: RequestValidationError):
        message, param = describe_validation_error(error)
        return error_response(400, message, param=param)

    @app.exception_handler(APIError)
    async def on_api_error(_request, error: APIError):
        return error_response(error.status, error.message, kind=error.kind, param=error.param, code=error.code)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_request, error: StarletteHTTPException):
        return error_response(error.status_code, str(error.detail), kind="invalid_request_error" if error.status_code < 500 else "server_error",
                              code=getattr(error, "code", None))

    @app.exception_handler(Exception)
    async def on_unexpected_error(_request, error: Exception):
        logger.exception("unhandled error in a request", exc_info=error)
        return error_response(500, f"internal error ({type(error).__name__}): {error}", kind="server_error")

    # ------------------------------------------------------------------ plain endpoints

    @app.get("/health")
    async def health():
        return Response(status_code=200 if engine.is_healthy else 503)

    @app.get("/version")
    async def version():
        return {"version": raygrid.__version__}

    @app.get("/metrics")
    async def metrics():
        text = engine.render_metrics()
        if text is None:  # the Serve application: Ray's metrics endpoint on each node exports them
            raise APIError(404, "metrics are exported by Ray's metrics endpoint on each node (as ray_raygrid_*), not here",
                           kind="not_found_error")
        return Response(text, media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=name, root=engine.config.model.model, max_model_len=max_len) for name in names])

    app.include_router(utility_router(engine, names, completion_serving.check_model,
                                      lambda status, message, param: APIError(status, message, param=param)))

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        return await completion_serving.create(request, raw)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw: Request):
        return await chat_serving.create(request, raw)

    return app
