"""EngineServer: one engine replica as a Ray Serve deployment (the LLM server of Ray Serve LLM's split).

Serve places each replica in a placement group built from the grid (``placement.replica_bundles``): an
engine of one rank runs in an engine process of the replica's own (as ``raygrid serve`` runs it, the device
being the replica's); an engine of several ranks runs its core on a thread here and its TP x PP workers as
Ray actors in the replica's bundles. Requests arrive already tokenized from the ingress, one streaming call
each (``generate``): Serve's router picks the replica, and cancelling the call aborts the request. The step
loop runs on a thread and hands each step's outputs to the calls' event loop in one wake-up; a call yields
whatever queued up since its last yield, so a busy replica sends fewer, larger messages.

Health is the engine's: ``check_health`` fails once the engine process or a worker is gone, and Serve then
replaces the replica (its workers and engine process die with it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import ray
from ray import serve
from ray.serve.exceptions import RayServeException
from ray.util import get_current_placement_group

from raygrid.engine.engine_client import EngineClient
from raygrid.engine.input_processor import InputProcessor
from raygrid.engine.metrics import EngineMetrics
from raygrid.engine.outputs import EngineCoreOutput, encode_outputs
from raygrid.engine.queues import drain
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats
from raygrid.serve.config import LLMConfig
from raygrid.serve.ray_metrics import RayExporter

logger = logging.getLogger(__name__)


class EngineUnavailableError(RuntimeError):
    """This replica's engine is gone; the ingress sends the request to another replica."""


@dataclass
class StreamBatch:
    """What one ``generate`` call yields: its request's outputs since the last yield, and the replica's state."""

    replica: str
    stats: SchedulerStats
    step_timing: dict[str, float]
    outputs: bytes  # list[EngineCoreOutput] as MessagePack (decode_outputs): several times cheaper than pickle


def _build_engine(llm_config: LLMConfig) -> EngineClient:
    config = llm_config.engine_args().create_engine_config()
    processor = InputProcessor(config)
    eos_token_ids = processor.eos_token_ids
    if not llm_config.uses_workers():
        from raygrid.engine.core_proc import EngineProcClient

        return EngineProcClient(config, eos_token_ids)
    from raygrid.cluster.ray_executor import RayExecutor
    from raygrid.engine.dp_engine import make_engine_core
    from raygrid.placement.placement import slots_in

    pg = get_current_placement_group()
    if pg is None:
        raise RuntimeError("EngineServer runs its workers in the replica's placement group; deploy it through build_app")
    executor = RayExecutor(config, eos_token_ids, slots_in(pg, config.parallel.replica_grid()))
    try:
        return make_engine_core(config, eos_token_ids, executor, processor.grammars)  # one tokenizer in this process
    except BaseException:
        executor.shutdown()
        raise


class EngineServer:
    def __init__(self, llm_config: LLMConfig | dict) -> None:
        self.llm_config = LLMConfig.model_validate(llm_config)
        try:
            self.replica = serve.get_replica_context().replica_id.unique_id
        except (RuntimeError, RayServeException):  # outside Serve (a plain actor, or the caller's process)
            self.replica = ray.get_runtime_context().get_actor_id() or "local"
        self.engine = _build_engine(self.llm_config)
        self.metrics = EngineMetrics(self.llm_config.model_id, exporter=RayExporter())  # its scheduler's, this replica's
        self.messages_per_s = self.llm_config.stream_messages_per_s
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._streams_lock = threading.Lock()
        self._stats = self.engine.stats()
        self._timing: dict[str, float] = {}
        self._last_observed = 0.0
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="raygrid-serve-steps", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ calls from the ingress

    async def generate(self, request: Request) -> AsyncIterator[StreamBatch]:
        """Run one request; yields its outputs as they come (several steps' at once when the caller lags). A request
        id already in flight on this replica is refused: its outputs would go to one of the two calls only."""
        self._raise_if_unavailable()
        loop, outputs = asyncio.get_running_loop(), asyncio.Queue()
        with self._streams_lock:
            if request.request_id in self._streams:
                raise ValueError(f"request_id {request.request_id!r} is already in flight on this replica")
            self._streams[request.request_id] = (loop, outputs)
        self._commands.put(("add", request))
        finished = False
        last_yield = -math.inf
        try:
            while not finished:
                batch = [await outputs.get()]
                # Each message costs both ends a fixed price (Ray's streaming protocol, the ingress's loop), so
                # this replica keeps its streams to stream_messages_per_s messages a second in all: with few
                # streams every step goes out at once; with many, each stream's steps are grouped.
                wait = len(self._streams) / self.messages_per_s - (time.monotonic() - last_yield)
                if wait > 0 and not batch[-1].finished:
                    await asyncio.sleep(wait)
                while not outputs.empty():
                    batch.append(outputs.get_nowait())
                finished = batch[-1].finished
                if finished and batch[-1].error and (self._error is not None or not all(self.engine.healthy)):
                    # The engine was lost: what it made goes out, and the caller continues the request on another
                    # replica (serve/engine_client.py).
                    if batch[:-1]:
                        yield StreamBatch(self.replica, self._stats, self._timing, encode_outputs(batch[:-1]))
                    raise EngineUnavailableError(batch[-1].error)
                last_yield = time.monotonic()
                yield StreamBatch(self.replica, self._stats, self._timing, encode_outputs(batch))
        finally:
            with self._streams_lock:
                self._streams.pop(request.request_id, None)
            if not finished:  # the caller went away (its call was cancelled): free the KV blocks
                self._commands.put(("abort", request.request_id))

    def check_health(self) -> None:
        """Serve's health check: fails once the engine cannot serve, so that Serve replaces this replica."""
        self._raise_if_unavailable()
        ping = getattr(getattr(self.engine, "executor", None), "check_workers", None)
        if ping is not None and not self.engine.has_unfinished_requests():
            ping()  # idle, a dead worker would go unnoticed until the next step

    def __del__(self) -> None:  # Serve's graceful shutdown of the replica
        self.shutdown()

    def shutdown(self) -> None:
        if not hasattr(self, "_thread") or self._stopping:  # __init__ failed, or shut down already
            return
        self._stopping = True
        self._commands.put(("stop",))
        self._thread.join(timeout=30)
        self.engine.shutdown()

    def _raise_if_unavailable(self) -> None:
        if self._error is not None:
            raise EngineUnavailableError(f"engine replica {self.replica} failed: {self._error}")
        if not all(self.engine.healthy) or not self._thread.is_alive():
            raise EngineUnavailableError(f"engine replica {self.replica} lost its engine")

    # ------------------------------------------------------------------ the step loop thread

    def _run(self) -> None:
        while not self._stopping:
            busy = self.engine.has_unfinished_requests()
            self._apply_commands(block=not busy)
            if self._stopping or not self.engine.has_unfinished_requests():
                self._observe(force=not busy)
                continue
            try:
                outputs = self.engine.step()
            except BaseException as error:  # noqa: BLE001 - the engine is lost; Serve replaces the replica
                logger.exception("engine replica %s failed", self.replica)
                self._error = error
                self._fail_all(f"engine replica {self.replica} failed: {error}")
                return
            self._observe()
            self._dispatch(outputs)

    def _apply_commands(self, block: bool) -> None:
        for kind, *payload in drain(self._commands, 0.5 if block else None):
            if kind == "add":
                try:
                    self.engine.add_request(payload[0])
                except Exception as error:  # noqa: BLE001 - this request fails; the others go on
                    self._dispatch([EngineCoreOutput(payload[0].request_id, [], [], finish_reason="abort", error=str(error))])
            elif kind == "abort":
                self.engine.abort_requests(payload)
            else:  # stop
                return

    def _observe(self, force: bool = False) -> None:
        self._stats = self.engine.stats()
        now = time.monotonic()
        if force or now - self._last_observed > 0.25:
            self._last_observed = now
            timings = self.engine.step_timing()
            self._timing = timings[0] if timings else {}
            self.metrics.observe_scheduler(self._stats)
            self.metrics.observe_replicas(self.engine.healthy)
            self.metrics.observe_step_timing(timings)

    def _dispatch(self, outputs: list[EngineCoreOutput]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, EngineCoreOutput]]] = {}
        with self._streams_lock:
            for out in outputs:
                stream = self._streams.get(out.req_id)
                if stream is not None:
                    by_loop.setdefault(stream[0], []).append((stream[1], out))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that loop is closed: its calls are gone
                pass

    def _fail_all(self, reason: str) -> None:
        with self._streams_lock:
            ids = list(self._streams)
        self._dispatch([EngineCoreOutput(rid, [], [], finish_reason="abort", error=reason) for rid in ids])


def _put_all(batch: list[tuple[asyncio.Queue, EngineCoreOutput]]) -> None:
    for outputs, out in batch:
        outputs.put_nowait(out)
