"""ServeEngineClient: the ingress's EngineClient over the engine deployment's Serve handle.

Each request is one streaming call, ``EngineServer.generate``: Serve's router picks the replica (fewest
requests in flight of two sampled) and counts it toward the deployment's autoscaling. The calls run on an
event loop of this client's own, on a thread; their outputs queue up for ``step()``, which the AsyncLLM
engine thread calls as it would any engine's. Aborting cancels the call, and the replica frees the request.

A call that fails (the replica it reached had lost its engine, or died) is sent again at growing intervals, for
up to ``migration_timeout_s``: Serve routes it to another replica or to the replacement of the lost one, which
Serve starts. A call that fails after outputs came back migrates (engine/migration.py): it is sent again as its
prompt plus the tokens received, so the stream goes on where it stopped, up to ``max_migrations`` times.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import weakref
from concurrent.futures import Future

from raygrid.engine.migration import Progress, past_limit
from raygrid.engine.outputs import EngineCoreOutput, decode_outputs
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats

logger = logging.getLogger(__name__)

_STALE_S = 10.0  # a replica not heard from this long no longer counts in stats()


class ServeEngineClient:
    def __init__(self, handle, max_migrations: int = 3, migration_timeout_s: float = 300.0, retry_wait_s: float = 0.25) -> None:
        self._handle = handle.options(stream=True)
        self.max_migrations, self.migration_timeout_s, self.retry_wait_s = max_migrations, migration_timeout_s, retry_wait_s
        self.num_migrations = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="raygrid-serve-client", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)
        self._ready: queue.SimpleQueue[list[EngineCoreOutput]] = queue.SimpleQueue()
        self._calls: dict[str, Future] = {}
        self._replicas: dict[str, tuple[float, SchedulerStats, dict[str, float]]] = {}

    # ------------------------------------------------------------------ EngineClient

    @property
    def healthy(self) -> list[bool]:
        """Whether this client can reach the deployment; the replicas' own health is Serve's to keep."""
        return [self._thread.is_alive()]

    @property
    def lost(self) -> bool:
        return not self._thread.is_alive()

    def add_request(self, request: Request) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the Serve engine client is shut down")
        self._calls[request.request_id] = asyncio.run_coroutine_threadsafe(self._stream(request), self._loop)

    def abort_requests(self, request_ids) -> None:
        for req_id in request_ids:
            call = self._calls.pop(req_id, None)
            if call is not None:
                call.cancel()  # cancels the task on the client loop, which cancels the Serve call

    def has_unfinished_requests(self) -> bool:
        return bool(self._calls)

    def step(self) -> list[EngineCoreOutput]:
        try:
            outputs = list(self._ready.get(timeout=0.05))
        except queue.Empty:
            return []
        while True:
            try:
                outputs.extend(self._ready.get_nowait())
            except queue.Empty:
                break
        for out in outputs:
            if out.finished:
                self._calls.pop(out.req_id, None)
        return outputs

    def stats(self) -> SchedulerStats:
        """The replicas' counters as of the outputs last streamed from each, summed (KV usage averaged), and this
        client's migrations."""
        stats = SchedulerStats.combined([stats for _, stats, _ in self._live_replicas()])
        stats.request_migrations = self.num_migrations
        return stats

    def step_timing(self) -> list[dict[str, float]]:
        return [timing for _, _, timing in self._live_replicas()]

    def shutdown(self) -> None:
        for call in list(self._calls.values()):
            call.cancel()
        self._calls.clear()
        self._finalizer()

    # ------------------------------------------------------------------ the client loop

    def _live_replicas(self):
        now = time.monotonic()
        return [entry for entry in list(self._replicas.values()) if now - entry[0] < _STALE_S]

    async def _stream(self, request: Request) -> None:
        progress, sent, failed_at, attempt = Progress(request), request, None, 0
        while True:
            call = self._handle.generate.remote(sent)
            heard = False
            try:
                async for batch in call:
                    heard = True
                    self._replicas[batch.replica] = (time.monotonic(), batch.stats, batch.step_timing)
                    outputs = decode_outputs(batch.outputs)
                    for out in outputs:
                        progress.record(out)
                    self._ready.put(outputs)
                return
            except asyncio.CancelledError:
                call.cancel()
                raise
            except Exception as error:  # noqa: BLE001 - a lost replica or engine: send it again, or fail this request
                reason = str(error).strip().splitlines()[-1][:300] if str(error).strip() else type(error).__name__
                now = time.monotonic()
                if heard:  # the engine lost it mid-stream: it continues elsewhere from the tokens received
                    resumed = progress.migrate(self.max_migrations)
                    if resumed is None:
                        return self._fail(request, past_limit(f"the engine replica failed: {reason}", self.max_migrations))
                    sent = resumed
                    self.num_migrations += 1
                    logger.warning("request %s migrates with %d token(s) made (move %d of at most %d) after: %s",
                                   request.request_id, len(progress.output_token_ids), progress.migrations,
                                   self.max_migrations, reason)
                    failed_at, attempt = now, 0
                    continue  # at once: Serve routes it to a replica that serves
                failed_at = failed_at or now
                if now - failed_at > self.migration_timeout_s:
                    return self._fail(request, f"no engine replica could take the request within migration_timeout_s="
                                               f"{self.migration_timeout_s:g} s; the last answer: {reason}")
                logger.warning("request %s: engine replica unavailable (%s); sending it again", request.request_id,
                               type(error).__name__)
                # Doubling waits, up to 4 s: long enough for Serve's health check to take a lost replica out of
                # routing, or to replace it.
                await asyncio.sleep(min(self.retry_wait_s * 2**attempt, 4.0))
                attempt += 1

    def _fail(self, request: Request, message: str) -> None:
        self._ready.put([EngineCoreOutput(request.request_id, [], [], finish_reason="abort", error=message)])


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
