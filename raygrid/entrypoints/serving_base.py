"""What the OpenAI routes share: the API's errors, a request's fields turned into SamplingParams, the
context-length check, and each request's stream from the engine (opened, drained, interleaved and cancelled
when the client goes away), plus the server-sent-event helpers."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator

import msgspec
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from raygrid.engine.async_llm import AsyncLLM, EngineDeadError, EngineOverloadedError
from raygrid.engine.detokenizer import TokenBytes
from raygrid.engine.outputs import RequestOutput
from raygrid.engine.sampling_params import SamplingParams
from raygrid.entrypoints.openai_protocol import (ChatCompletionRequest, CompletionRequest, ErrorInfo, ErrorResponse, PromptLogprob,
                                                 PromptLogprobs)

logger = logging.getLogger(__name__)
encode_json = msgspec.json.Encoder().encode


class RequestFailedError(RuntimeError):
    """A request the engine failed (it refused it, or the engine process is gone): the client gets an error,
    never a normal finish. ``invalid``: the request's own fault (RequestOutput.invalid), a 400 and an
    invalid_request_error rather than a 500 and a server_error."""

    def __init__(self, message: str, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid

    @property
    def status(self) -> int:
        return 400 if self.invalid else 500

    @property
    def kind(self) -> str:
        return "invalid_request_error" if self.invalid else "server_error"


def error_event(error: Exception) -> str:
    """A stream's error event, as OpenAI's API types it. An error that is neither the request's nor the engine's
    (a bug of the route's) is logged with its traceback, and named as the non-streamed routes name it."""
    if isinstance(error, (RequestFailedError, EngineDeadError)):
        kind, message = getattr(error, "kind", "server_error"), str(error)
    else:
        logger.exception("a stream failed", exc_info=error)
        kind, message = "server_error", f"internal error ({type(error).__name__}): {error}"
    return sse(ErrorResponse(error=ErrorInfo(message=message, type=kind)))


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind


def describe_validation_error(error: ValidationError | RequestValidationError) -> tuple[str, str | None]:
    """'field: problem' lines from pydantic's errors, and the first field's name.

    A field of several types (``stop: str | list[str]``) fails once per type, each under a location that names
    the type (``stop.str``, ``stop.list[str]``). Those failures are one problem of the field (``_union_problem``)."""
    lines, groups, param = [], {}, None
    for item in error.errors():
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        if item.get("type") == "json_invalid":
            loc = []  # the location is a character offset, not a field
        problem = "is not supported by raygrid" if item.get("type") == "extra_forbidden" else item.get("msg", "")
        problem = problem.removeprefix("Value error, ")  # pydantic's wrapping of a validator's ValueError
        if not loc and item.get("type") == "value_error":  # a check across fields: its message names them
            lines.append((None, problem))
            param = param or getattr(item.get("ctx", {}).get("error"), "param", None)  # an InvalidRequest's field
            continue
        branch = next((i for i, part in enumerate(loc) if _UNION_BRANCH.match(part)), len(loc))
        groups.setdefault(tuple(loc[:branch]), []).append((loc[branch:], item, problem))
    for head, found in groups.items():
        if len({tuple(rest[:1]) for rest, _, _ in found}) > 1:  # several types of one field failed
            lines += _union_problem(".".join(head) or "body", found)
        else:
            lines += [(".".join(list(head) + rest) or "body", problem) for rest, _, problem in found]
    fields = [field for field, _ in lines if field]
    return "; ".join(f"{field}: {problem}" if field else problem for field, problem in lines) or str(error), next(iter(fields), param)


# A location part naming one type of a union: ``str``, ``list[ChatContentPart]``, ``literal['text']``, a model's
# class (``NamedToolChoice``). Fields are snake_case.
_UNION_BRANCH = re.compile(r"^(str|int|float|bool|none|bytes)$|^[\w-]+\[.*\]$|^[A-Z][A-Za-z0-9]*$")


def _union_problem(field: str, found: list[tuple[list[str], dict, str]]) -> list[tuple[str, str]]:
    """A union field's problem from its types' failures (each: the location past the type's name, the error, its
    message): a check's own message where a type has one (``content parts of type 'image_url' are not
    supported``); else the failures inside a type that got further than its shape (``tool_choice.function.name:
    Field required``); else the types' messages joined (``stop: input should be a valid string or a valid list
    (got 5)``)."""
    checks = [problem for _, item, problem in found if item.get("type") == "value_error"]
    if checks:
        return [(field, problem) for problem in dict.fromkeys(checks)]
    inside = [(".".join([field, *rest[1:]]), problem) for rest, _, problem in found if len(rest) > 1]
    if inside:
        return list(dict.fromkeys(inside))
    kinds = dict.fromkeys(problem.removeprefix("Input should be ") for _, _, problem in found)
    given = found[0][1]
    return [(field, "input should be " + " or ".join(kinds) + (f" (got {given['input']!r:.80})" if "input" in given else ""))]


class OpenAIServing:
    """The part of a completions or chat route that does not depend on which: checks, then the engine's streams."""

    def __init__(self, engine: AsyncLLM, served_model_names: list[str]) -> None:
        self.engine = engine
        self.names = served_model_names
        self.max_len = engine.config.model.max_model_len
        self.generation_defaults = engine.processor.default_sampling_params()
        tokenizer = engine.processor.tokenizer
        self.token_bytes = TokenBytes(tokenizer)  # logprobs: a token's bytes, and its offset in the text
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", ()))

    def check_model(self, model: str) -> None:
        if model not in self.names:
            raise APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found", kind="NotFoundError")

    @staticmethod
    def request_ids(prefix: str, request: CompletionRequest | ChatCompletionRequest, raw: Request) -> tuple[str, str]:
        """The response's id and the engine's. As in vLLM the response's is ``prefix-`` and the X-Request-Id header,
        else the body's ``request_id``, else a fresh one. A caller may give one id to several requests in flight, so
        the engine's adds a fresh suffix to a given one: no request ever takes another's place in the engine."""
        given = raw.headers.get("x-request-id") or request.request_id
        public = f"{prefix}-{given or uuid.uuid4().hex}"
        return public, f"{public}-{uuid.uuid4().hex[:8]}" if given else public

    def make_params(self, request: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        if caller := request.caller_fields():
            logger.info("request from %s", caller)
        if request.prompt_logprobs is not None and request.stream:
            raise APIError(400, "prompt_logprobs is not available with stream=true", param="prompt_logprobs")
        if request.stream_options is not None and not request.stream:  # as OpenAI and vLLM: not ignored
            raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
        try:
            return request.sampling_params(self.generation_defaults)
        except ValidationError as error:
            message, param = describe_validation_error(error)
            raise APIError(400, message, param=param) from None
        except ValueError as error:
            raise APIError(400, str(error), param=getattr(error, "param", None)) from None

    def check_context(self, prompt_ids: list[int], params: SamplingParams, what: str) -> None:
        max_len = self.max_len
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
            self.engine.processor.validate(prompt_ids, params)
        except ValueError as error:
            raise APIError(400, str(error), param=getattr(error, "param", what)) from None

    async def start(self, prompt_ids: list[int], params: SamplingParams, request, request_id: str) -> AsyncIterator[RequestOutput]:
        """The request's stream of delta outputs, once the engine has taken it (a refusal raises APIError here)."""
        engine = self.engine
        prompt = {"prompt_token_ids": prompt_ids, "cache_salt": request.cache_salt}
        try:
            stream = engine.generate(prompt, params, request_id=request_id, priority=request.priority, delta=True)
            first = await stream.__anext__()
        except EngineOverloadedError as error:
            raise APIError(503, str(error), kind="server_error") from None
        except EngineDeadError as error:
            raise APIError(500, str(error), kind="server_error") from None
        except ValueError as error:
            raise APIError(400, str(error), param=getattr(error, "param", None)) from None

        async def chained():
            try:
                item = first
                while True:
                    if item.error:  # failed in the engine (a refusal, or the engine is gone): not a finish
                        raise RequestFailedError(item.error, item.invalid)
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
    failure = gathered.exception()
    if isinstance(failure, RequestFailedError):
        await cancel_all(tasks, streams)  # the other prompts of the request stop too
        raise APIError(failure.status, str(failure), kind=failure.kind)
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


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """Fold a request's delta outputs back into one RequestOutput (its prompt logprobs included)."""
    merged = RequestOutput(outputs[0].request_id if outputs else "", None, [], [], False)
    for output in outputs:
        merged.add(output)
    return merged


# What a logprob of -inf (a token the request's grammar rules out: the mask is applied before the logprobs are read,
# as vLLM orders it) is written as: JSON has no infinities, and vLLM's server writes this floor.
LOWEST_LOGPROB = -9999.0


def wire_logprob(value: float) -> float:
    """A logprob as the API writes it: at least LOWEST_LOGPROB (NaN too, which compares false)."""
    return value if value >= LOWEST_LOGPROB else LOWEST_LOGPROB


def token_name(token_id: int, logprob, as_ids: bool) -> str:
    """A logprobs entry's token as the wire names it: its text, or by its id, 'token_id:N', with
    ``return_tokens_as_token_ids`` (as vLLM writes it)."""
    return f"token_id:{token_id}" if as_ids else logprob.decoded_token or ""


def top_items(entry, k: int):
    """The (token id, Logprob) pairs of the k most likely tokens, most likely first."""
    return sorted(((t, lp) for t, lp in entry.items() if lp.rank <= k), key=lambda item: item[1].rank)


def prompt_logprobs(entries, prompt_ids: list[int], k: int | None) -> PromptLogprobs | None:
    """vLLM's prompt_logprobs field: per prompt token its own entry and the k most likely (None without the ask)."""
    if k is None:
        return None
    return [None if entry is None else {token_id: PromptLogprob(logprob=wire_logprob(lp.logprob), rank=lp.rank, decoded_token=lp.decoded_token)
                                        for token_id, lp in entry.items() if lp.rank <= k or token_id == prompt_id}
            for prompt_id, entry in zip(prompt_ids, entries or [])]


def sse_json(payload: dict) -> bytes:
    return b"data: " + encode_json(payload) + b"\n\n"  # msgspec: a tenth of json.dumps's time


def sse(payload) -> str:
    data = payload if isinstance(payload, str) else payload.model_dump_json(exclude_unset=False)
    return f"data: {data}\n\n"


def streaming(body: AsyncIterator) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
