"""What the server checks before a request reaches a route: the API key and the request body's size and
pace. Both are plain ASGI middleware: Starlette's BaseHTTPMiddleware wraps ``receive`` in a way that hides
a client's disconnect from the route, and a non-streaming request must see it to abort its work.
Refusals carry OpenAI's error body."""

from __future__ import annotations

import asyncio
import hmac
import uuid

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from raygrid.entrypoints.openai_protocol import ErrorInfo, ErrorResponse


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> JSONResponse:
    """OpenAI's error body, for the routes and for the guards below alike."""
    body = ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status)


def bearer_token(scope) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; the scheme is case-insensitive (RFC 9110),
    and the token is taken exactly: extra spaces make it a different token."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token if scheme.lower() == "bearer" else None
    return None


class ApiKeyGuard:
    """Every route needs ``Authorization: Bearer KEY`` except ``open_paths`` (/health; /metrics when the
    operator lets Prometheus scrape without a key). Compared in constant time."""

    def __init__(self, app, api_key: str, open_paths: frozenset[str]) -> None:
        self.app, self.key, self.open_paths = app, api_key.encode(), open_paths

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            token = bearer_token(scope)
            if token is None or not hmac.compare_digest(token.encode(), self.key):
                refusal = error_response(401, "Incorrect or missing API key (Authorization: Bearer ...)", code="invalid_api_key")
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


class RequestIdHeader:
    """Every response carries ``x-request-id``: the request's own, or a fresh one (to find a request in the logs)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope.get("headers", ()) if name == b"x-request-id"), None)
        request_id = given or uuid.uuid4().hex.encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), (b"x-request-id", request_id)])
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyTooLarge(HTTPException):
    """Raised from ``receive``; an HTTPException so that the route's body parsing passes it on as it is."""

    code = "request_too_large"

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


class BodyTimeout(HTTPException):
    code = "request_timeout"

    def __init__(self, detail: str) -> None:
        super().__init__(408, detail)


class BodyGuard:
    """Refuses a body over ``max_bytes`` with 413, from its Content-Length before reading, or once the bytes
    read pass the limit; and a body whose next part takes longer than ``read_timeout_s`` (a client that
    announces more than it sends) with 408. Once the body is complete, ``receive`` is left alone."""

    def __init__(self, app, max_bytes: int, read_timeout_s: float) -> None:
        self.app, self.max_bytes, self.read_timeout_s = app, max_bytes, read_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                refusal = error_response(413, self._too_large(int(value)), code=BodyTooLarge.code)
                return await refusal(scope, receive, send)
        received, body_done, started = 0, False, False

        async def guarded_receive():
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except asyncio.TimeoutError:
                raise BodyTimeout(f"the request body did not arrive within {self.read_timeout_s:g} s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self._too_large(received))
                body_done = not message.get("more_body", False)
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded_receive, tracking_send)
        except (BodyTooLarge, BodyTimeout) as error:  # raised outside a route's error handling
            if started:
                raise
            await error_response(error.status_code, error.detail, code=error.code)(scope, receive, send)

    def _too_large(self, size: int) -> str:
        return f"the request body has {size} bytes; the limit is {self.max_bytes} (--max-request-body-bytes)"


class FairAdmission:
    """Requests whose bodies have arrived take turns through their first stretch of work on the event loop (JSON
    parsing, validation, building the engine request, up to its first real wait), one stretch per turn.

    Without it a burst of N requests queues N such stretches on the event loop at once, and a /health probe that
    arrives meanwhile waits for all of them (seconds, for 300 requests of 40,000 token ids on two cores). With it,
    a request that finds another's stretch running waits behind it in a FIFO; the turn passes on with
    ``call_soon`` once the running stretch suspends, which puts the next request behind whatever else is already
    ready (a probe, another request's chunk), never ahead of it. The work per request is the same; only its order
    changes."""

    def __init__(self, app) -> None:
        self.app = app
        self.turn = asyncio.Lock()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()

        async def receive_in_turn():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                await self.turn.acquire()
                loop.call_soon(self.turn.release)  # runs once this stretch of the route suspends
            return message

        await self.app(scope, receive_in_turn, send)


def header_timeout_protocol(timeout_s: float):
    """uvicorn's h11 protocol, plus a deadline for a request's headers: a connection that opens and sends
    nothing, or sends part of the next request's headers and stalls, is closed after ``timeout_s`` (uvicorn
    itself only times out connections that are idle between requests)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderTimeoutProtocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.loop.call_later(timeout_s, self._headers_overdue)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self.loop.call_later(timeout_s, self._headers_overdue)

        def _headers_overdue(self) -> None:
            if self.transport.is_closing():
                return
            never_started = self.cycle is None
            stalled = self.cycle is not None and self.cycle.response_complete and bool(self.conn.trailing_data[0])
            if never_started or stalled:
                self.transport.close()

    return HeaderTimeoutProtocol
