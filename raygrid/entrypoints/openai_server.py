"""OpenAI-compatible HTTP server (FastAPI) over AsyncLLM.

POST /v1/completions and /v1/chat/completions (streamed as server-sent events or not), GET /v1/models,
/health, /version and /metrics (Prometheus). Every client error gets the OpenAI error body with a 4xx
status; the engine keeps serving the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

import raygrid
from raygrid.engine.async_llm import AsyncLLM, EngineDeadError, EngineOverloadedError
from raygrid.engine.detokenizer import TokenBytes
from raygrid.engine.outputs import CompletionOutput, RequestOutput
from raygrid.engine.sampling_params import SamplingParams
from raygrid.entrypoints.http_guards import ApiKeyGuard, BodyGuard, RequestIdHeader, error_response
from raygrid.entrypoints.openai_protocol import (
    AssistantMessage,
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatTokenLogprob,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    SYSTEM_FINGERPRINT,
    ModelList,
    TopLogprob,
    UsageInfo,
    random_id,
)
from raygrid.entrypoints.reasoning import REASONING_PARSERS
from raygrid.entrypoints.tool_calls import ToolStream, reply_tool_calls, tool_finish_reason
from raygrid.entrypoints.utility_routes import utility_router

logger = logging.getLogger(__name__)
encode_json = msgspec.json.Encoder().encode


class RequestFailedError(RuntimeError):
    """A request the engine failed (it refused it, or the engine process is gone): the client gets an error,
    never a normal finish."""


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def describe_validation_error(error: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """'field: problem' lines from pydantic's errors, and the first field's name."""
    lines, first = [], None
    for item in error.errors():
        loc = [str(p) for p in item.get("loc", ()) if p not in ("body",)]
        if item.get("type") == "json_invalid":
            loc = []  # the location is a character offset, not a field
        field = ".".join(loc) or "body"
        first = first or field
        problem = "is not supported by raygrid" if item.get("type") == "extra_forbidden" else item.get("msg")
        lines.append(f"{field}: {problem}")
    return "; ".join(lines) or str(error), first


def build_app(engine: AsyncLLM, api_key: str | None = None, served_model_names: list[str] | None = None,
              max_request_body_bytes: int = 8 * 2**20, body_read_timeout_s: float = 30.0,
              metrics_without_auth: bool = False, allowed_origins: list[str] | None = None,
              reasoning_parser: str | None = None, tool_call_parser: str | None = None) -> FastAPI:
    names = served_model_names or [engine.model_name]
    reasoning = REASONING_PARSERS[reasoning_parser]() if reasoning_parser else None
    max_len = engine.config.model.max_model_len
    token_bytes = TokenBytes(engine.processor.tokenizer)
    app = FastAPI(title="raygrid OpenAI-compatible server", version=raygrid.__version__)
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

    # ------------------------------------------------------------------ helpers

    def check_model(model: str) -> None:
        if model not in names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found", kind="NotFoundError")

    app.include_router(utility_router(engine, names, check_model, lambda status, message, param: APIError(status, message, param=param)))

    generation_defaults = engine.processor.default_sampling_params()

    def make_params(request: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        if caller := request.caller_fields():
            logger.info("request from %s", caller)
        try:
            return request.sampling_params(generation_defaults)
        except ValidationError as error:
            message, param = describe_validation_error(error)
            raise APIError(400, message, param=param) from None
        except ValueError as error:
            raise APIError(400, str(error)) from None

    def check_context(prompt_ids: list[int], params: SamplingParams, what: str) -> None:
        requested = len(prompt_ids) + (params.max_tokens or 0)
        if len(prompt_ids) >= max_len or requested > max_len:
            raise APIError(
                400,
                f"This model's maximum context length is {max_len} tokens. However, you requested {requested} tokens "
                f"({len(prompt_ids)} in the {what}, {params.max_tokens or 0} in the completion). "
                f"Please reduce the length of the {what} or completion.",
                param=what,
                code="context_length_exceeded",
            )
        try:  # the engine's own limits: empty prompt, token ids, logprobs
            engine.processor.validate(prompt_ids, params)
        except ValueError as error:
            raise APIError(400, str(error), param=getattr(error, "param", what)) from None

    async def start(prompt_ids: list[int], params: SamplingParams, request, request_id: str) -> AsyncIterator[RequestOutput]:
        prompt = {"prompt_token_ids": prompt_ids, "cache_salt": request.cache_salt}
        try:
            stream = engine.generate(prompt, params, request_id=request_id, priority=request.priority, delta=True)
            first = await stream.__anext__()
        except EngineOverloadedError as error:
            raise APIError(503, str(error), kind="server_error") from None
        except EngineDeadError as error:
            raise APIError(500, str(error), kind="server_error") from None
        except ValueError as error:
            raise APIError(400, str(error)) from None

        async def chained():
            try:
                item = first
                while True:
                    if item.error:  # failed in the engine (a refusal, or the engine is gone): not a finish
                        raise RequestFailedError(item.error)
                    yield item
                    if item.finished:
                        return
                    item = await stream.__anext__()
            finally:
                await stream.aclose()
                engine.abort(request_id)  # a no-op for a finished request

        return chained()

    async def collect(streams: list[AsyncIterator[RequestOutput]], raw: Request) -> list[list[RequestOutput]]:
        """Drain the streams; abort everything if the client goes away first."""
        async def drain(stream):
            return [item async for item in stream]

        tasks = [asyncio.ensure_future(drain(s)) for s in streams]
        gathered = asyncio.gather(*tasks)
        while not gathered.done():
            done, _ = await asyncio.wait({gathered}, timeout=0.5)
            if not done and await raw.is_disconnected():
                await cancel_all(tasks, streams)
                raise asyncio.CancelledError("client disconnected")
        if isinstance(gathered.exception(), RequestFailedError):
            await cancel_all(tasks, streams)  # the other prompts of the request stop too
            raise APIError(500, str(gathered.exception()), kind="server_error")
        return gathered.result()

    async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Interleave several streams as their items arrive: (stream index, item)."""
        if len(streams) == 1:  # the common case: no task and no queue hop per chunk
            try:
                async for item in streams[0]:
                    yield 0, item
            finally:
                await streams[0].aclose()  # aborts the request if it did not finish
            return
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(i, stream):
            try:
                async for item in stream:
                    await queue.put((i, item))
            finally:
                await queue.put((i, done))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        try:
            remaining = len(streams)
            while remaining:
                i, item = await queue.get()
                if item is done:
                    remaining -= 1
                    continue
                yield i, item
            for task in tasks:
                task.result()  # surface an engine failure
        finally:
            await cancel_all(tasks, streams)

    async def cancel_all(tasks, streams) -> None:
        """Cancel the tasks draining streams, let them unwind (which aborts their requests), close the streams."""
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()

    def sse_json(payload: dict) -> bytes:
        return b"data: " + encode_json(payload) + b"\n\n"  # msgspec: a tenth of json.dumps's time

    def sse(payload) -> str:
        data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_unset=False)
        return f"data: {data}\n\n"

    def streaming(body: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    # ------------------------------------------------------------------ completions

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest, raw: Request):
        check_model(request.model)
        if request.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise APIError(400, f"best_of ({request.best_of}) is not supported: raygrid returns every one of the n completions it makes",
                           param="best_of")
        params = make_params(request)
        has_text = isinstance(request.prompt, str) or any(isinstance(p, str) for p in request.prompt)
        # Off the event loop when there is text to tokenize; token ids need no thread hop.
        prompts = await asyncio.to_thread(normalize_prompts, request.prompt, engine) if has_text else normalize_prompts(request.prompt, engine)
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": max(max_len - max(len(p) for p in prompts), 1)})
        for ids in prompts:
            check_context(ids, params, "prompt")
        request_id = random_id("cmpl")
        streams = [await start(ids, params, request, f"{request_id}-{i}") for i, ids in enumerate(prompts)]
        n = params.n
        if request.stream:
            return streaming(stream_completions(request, request_id, prompts, streams, n))
        results = await collect(streams, raw)
        choices, completion_tokens = [], 0
        for i, outputs in enumerate(results):
            merged = merge_outputs(outputs)
            echoed = echo_text(request, prompts, i)
            for completion in merged.outputs:
                if request.echo_only:
                    completion = echo_only_completion(completion, params.logprobs is not None)
                completion_tokens += len(completion.token_ids)
                logprobs = None
                if params.logprobs is not None:
                    logprobs = echo_logprobs(request, prompts[i], merged.prompt_logprobs)
                    append_legacy_logprobs(logprobs, completion.token_ids, completion.logprobs or [], params.logprobs, len(echoed))
                choices.append(
                    CompletionChoice(
                        index=i * n + completion.index,
                        text=echoed + completion.text,
                        logprobs=logprobs,
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                    )
                )
        prompt_tokens = sum(len(p) for p in prompts)
        usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)
        return CompletionResponse(id=request_id, model=request.model, choices=sorted(choices, key=lambda c: c.index), usage=usage)

    def echo_text(request: CompletionRequest, prompts, i: int) -> str:
        """echo: the prompt comes first, as in OpenAI's legacy API ("" without echo)."""
        if not request.echo:
            return ""
        return request_prompt_text(request.prompt, i) or engine.processor.tokenizer.decode(prompts[i])

    def echo_logprobs(request: CompletionRequest, prompt_ids: list[int], prompt_logprobs) -> CompletionLogprobs:
        """Legacy logprobs that start with the prompt's tokens under echo (the first has no entry: nothing predicts it)."""
        logprobs = CompletionLogprobs()
        if request.echo:
            entries = list(prompt_logprobs or [])
            entries += [None] * (len(prompt_ids) - len(entries))
            append_legacy_logprobs(logprobs, prompt_ids, entries, request.logprobs, 0, decode_one)
        return logprobs

    def decode_one(token_id: int) -> str:
        return engine.processor.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def stream_completions(request: CompletionRequest, request_id: str, prompts, streams, n: int) -> AsyncIterator[str]:
        created = int(time.time())
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        continuous = include_usage and request.stream_options.continuous_usage_stats
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = 0
        offsets: dict[int, int] = {}  # per choice: text sent so far (the first chunk carries the echoed prompt)
        try:
            async for i, output in merge(streams):
                for completion in output.outputs:
                    index = i * n + completion.index
                    if request.echo_only:
                        completion = echo_only_completion(completion, request.logprobs is not None)
                    completion_tokens += len(completion.token_ids)
                    echoed = echo_text(request, prompts, i) if index not in offsets else ""
                    offsets.setdefault(index, 0)
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = echo_logprobs(request, prompts[i], output.prompt_logprobs) if echoed else CompletionLogprobs()
                        append_legacy_logprobs(logprobs, completion.token_ids, completion.logprobs or [], request.logprobs,
                                               offsets[index] + len(echoed))
                    completion = dataclasses.replace(completion, text=echoed + completion.text) if echoed else completion
                    offsets[index] += len(completion.text)
                    # The hot path of streaming: the chunk (CompletionResponse's shape) as a plain dict, no pydantic.
                    body = {
                        "id": request_id, "object": "text_completion", "created": created, "model": request.model,
                        "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [{"index": index, "text": completion.text,
                                     "logprobs": logprobs.model_dump() if logprobs is not None else None,
                                     "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}],
                    }
                    if include_usage:  # as OpenAI's: null until the last chunk, unless asked for continuously
                        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                         "total_tokens": prompt_tokens + completion_tokens} if continuous else None
                    yield sse_json(body)
            if include_usage:
                usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)
                yield sse(CompletionResponse(id=request_id, created=created, model=request.model, choices=[], usage=usage))
        except (EngineDeadError, RuntimeError) as error:
            yield sse(ErrorResponse(error=ErrorInfo(message=str(error), type="server_error")))
        yield sse("[DONE]")

    # ------------------------------------------------------------------ chat completions

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest, raw: Request):
        check_model(request.model)
        if request.tools and request.effective_tool_choice == "auto" and tool_call_parser is None:
            raise APIError(400, "tool_choice 'auto' (the default with tools) needs the server started with --tool-call-parser",
                           param="tool_choice")
        params = make_params(request)
        try:
            conversation = [m.for_template() for m in request.messages]
            # Off the event loop: a large conversation must not stall /health and the streams in flight.
            prompt_ids = await asyncio.to_thread(engine.processor.apply_chat_template, conversation, request.chat_template,
                                                 request.add_generation_prompt, tools=request.tool_dicts() or None,
                                                 **(request.chat_template_kwargs or {}))
        except ValueError as error:
            raise APIError(400, str(error), param="messages") from None
        except Exception as error:  # a template that fails to render on this conversation
            raise APIError(400, f"messages: the chat template failed: {error}", param="messages") from None
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": max(max_len - len(prompt_ids), 1)})
        check_context(prompt_ids, params, "messages")
        request_id = random_id("chatcmpl")
        stream = await start(prompt_ids, params, request, request_id)
        if request.stream:
            return streaming(stream_chat(request, request_id, prompt_ids, stream, params))
        opened = prompt_opens_thinking(prompt_ids)
        (outputs,) = await collect([stream], raw)
        choices, completion_tokens = [], 0
        for completion in merge_deltas(outputs):
            completion_tokens += len(completion.token_ids)
            message = assistant_message(completion.text, opened)
            message.content, message.tool_calls = reply_tool_calls(message.content or "", request.effective_tool_choice,
                                                                    tool_call_parser is not None)
            choices.append(
                ChatCompletionChoice(
                    index=completion.index,
                    message=message,
                    logprobs=chat_logprobs(completion, params.logprobs, token_bytes) if params.logprobs is not None else None,
                    finish_reason=tool_finish_reason(completion.finish_reason, bool(message.tool_calls), request.effective_tool_choice),
                    stop_reason=completion.stop_reason,
                )
            )
        usage = UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens, total_tokens=len(prompt_ids) + completion_tokens)
        return ChatCompletionResponse(id=request_id, model=request.model, choices=choices, usage=usage)

    def prompt_opens_thinking(prompt_ids: list[int]) -> bool:
        return reasoning is not None and reasoning.opens_thinking(engine.processor.tokenizer.decode(prompt_ids[-8:]))

    def assistant_message(text: str, opened: bool) -> AssistantMessage:
        if reasoning is None:
            return AssistantMessage(content=text)
        thought, answer = reasoning.split(text, opened)
        return AssistantMessage(content=answer, reasoning_content=thought)

    async def stream_chat(request: ChatCompletionRequest, request_id: str, prompt_ids, stream, params: SamplingParams) -> AsyncIterator[str]:
        created = int(time.time())
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        continuous = include_usage and request.stream_options.continuous_usage_stats
        prompt_tokens, completion_tokens = len(prompt_ids), 0

        # The hot path of streaming: chunks (ChatCompletionChunk's shape) as plain dicts, no pydantic. As
        # OpenAI's, "usage" is there (null until the last chunk) only when asked for.
        def chunk(choices, usage=None):
            body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": request.model,
                    "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}
            if include_usage:
                body["usage"] = usage
            return sse_json(body)

        def usage_now():
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}

        # With a reasoning parser, each choice's text goes through its own splitter into reasoning and answer.
        opened = prompt_opens_thinking(prompt_ids)
        splitters = [reasoning.stream(opened) for _ in range(params.n)] if reasoning is not None else None
        tools = [ToolStream(request.effective_tool_choice, tool_call_parser is not None) for _ in range(params.n)]
        # The first chunk of each choice carries the role, as OpenAI's does; later deltas carry content only.
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                     for i in range(params.n)])
        try:
            async for _, output in merge([stream]):
                for completion in output.outputs:
                    completion_tokens += len(completion.token_ids)
                    logprobs = chat_logprobs(completion, params.logprobs, token_bytes).model_dump() if params.logprobs is not None else None
                    delta = {"content": completion.text}
                    if splitters is not None:
                        thought, answer = splitters[completion.index].feed(completion.text)
                        if completion.finish_reason is not None:
                            more_thought, more_answer = splitters[completion.index].finish()
                            thought, answer = thought + more_thought, answer + more_answer
                        delta = {"reasoning_content": thought, "content": answer} if thought else {"content": answer}
                    finish_reason = completion.finish_reason
                    if tools[completion.index].active:
                        delta = tool_delta(tools[completion.index], delta, finish_reason is not None)
                        finish_reason = tools[completion.index].finish_reason(finish_reason)
                    choice = {"index": completion.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
                    yield chunk([choice], usage_now() if continuous else None)
            if include_usage:
                yield chunk([], usage_now())
        except (EngineDeadError, RuntimeError) as error:
            yield sse(ErrorResponse(error=ErrorInfo(message=str(error), type="server_error")))
        yield sse("[DONE]")

    return app


def tool_delta(tools: ToolStream, delta: dict, last: bool) -> dict:
    """A chat delta with its content passed through the choice's tool-call parsing."""
    content, calls = tools.feed(delta.get("content") or "")
    if last:
        more_content, more_calls = tools.finish()
        content, calls = content + more_content, calls + more_calls
    delta = dict(delta, content=content)
    if calls:
        delta["tool_calls"] = calls
    return delta


def echo_only_completion(completion: CompletionOutput, with_logprobs: bool) -> CompletionOutput:
    """echo with max_tokens 0: the one token the engine had to sample is dropped."""
    return CompletionOutput(completion.index, "", [], None, [] if with_logprobs else None, finish_reason="length")


def normalize_prompts(prompt, engine: AsyncLLM) -> list[list[int]]:
    """The four prompt shapes of the completions API, as token id lists."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError(400, "prompt is empty", param="prompt")
    try:
        return [engine.processor.tokenize_prompt(p)[1] if isinstance(p, str) else list(p) for p in prompts]
    except (ValueError, TypeError, UnicodeError) as error:  # e.g. a lone UTF-16 surrogate the tokenizer cannot take
        raise APIError(400, f"prompt cannot be tokenized: {error}", param="prompt") from None


def merge_deltas(outputs: list[RequestOutput]) -> list[CompletionOutput]:
    """Fold a request's delta outputs back into one CompletionOutput per completion."""
    return merge_outputs(outputs).outputs


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """Fold a request's delta outputs back into one RequestOutput (its prompt logprobs included)."""
    merged = RequestOutput(outputs[0].request_id if outputs else "", None, [], [], False)
    for output in outputs:
        merged.add(output)
    return merged


def request_prompt_text(prompt, index: int) -> str | None:
    """The text of the index-th prompt of a completions request, when it was given as text."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and index < len(prompt) and isinstance(prompt[index], str):
        return prompt[index]
    return None


def _top_entries(entry, k: int):
    return [lp for _, lp in _top_items(entry, k)]


def _top_items(entry, k: int):
    """The (token id, Logprob) pairs of the k most likely tokens, most likely first."""
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= k), key=lambda item: item[1].rank)


def append_legacy_logprobs(out: CompletionLogprobs, token_ids: list[int], entries: list, k: int, text_offset: int,
                           text_of=lambda _token_id: "") -> None:
    """Append positions to OpenAI's legacy logprobs shape, their text offsets counted from ``text_offset``. An
    entry of None (a prompt's first token) has no logprob; a token with no decoded text takes ``text_of``'s."""
    for token_id, entry in zip(token_ids, entries):
        chosen = entry[token_id] if entry is not None else None
        token = chosen.decoded_token if chosen is not None and chosen.decoded_token is not None else text_of(token_id)
        out.tokens.append(token)
        out.token_logprobs.append(chosen.logprob if chosen is not None else None)
        out.text_offset.append(text_offset)
        text_offset += len(token)
        out.top_logprobs.append({(lp.decoded_token or ""): lp.logprob for lp in _top_entries(entry, k)} if entry is not None else None)


def chat_logprobs(completion: CompletionOutput, k: int, token_bytes: TokenBytes) -> ChatChoiceLogprobs:
    """OpenAI's chat logprobs; ``bytes`` are each token's own (a token holding part of a character decodes to U+FFFD)."""
    content = []
    for token_id, entry in zip(completion.token_ids, completion.logprobs or []):
        sampled = entry[token_id]
        content.append(
            ChatTokenLogprob(
                token=sampled.decoded_token or "",
                logprob=sampled.logprob,
                bytes=token_bytes(token_id),
                top_logprobs=[TopLogprob(token=lp.decoded_token or "", logprob=lp.logprob, bytes=token_bytes(top_id))
                              for top_id, lp in _top_items(entry, k)],
            )
        )
    return ChatChoiceLogprobs(content=content)

