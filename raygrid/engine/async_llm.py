"""AsyncLLM: the streaming front end for servers.

The engine's step loop runs on a thread of its own, so the asyncio event loop that talks to clients
only queues commands (add, abort) and receives outputs; a slow client never stalls the engine or the
other clients. Each request has an asyncio queue its outputs are pushed into from the engine thread.
A request whose consumer goes away (cancelled task, closed connection) is aborted and its KV blocks
are freed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from raygrid.engine.engine_client import EngineClient, create_engine
from raygrid.engine.input_processor import InputProcessor, ProcessedRequest, PromptType, build_engine_config
from raygrid.engine.metrics import EngineMetrics
from raygrid.engine.output_processor import OutputProcessor
from raygrid.engine.outputs import EngineCoreOutput, RequestOutput
from raygrid.engine.queues import drain
from raygrid.engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop failed; no request can be served any more."""


class EngineOverloadedError(RuntimeError):
    """Too many requests are queued; the caller should retry later (HTTP 503)."""


class _Deliveries:
    """What the engine thread hands to one event loop's streams, put into their queues a slice per turn of that
    loop, first in first out.

    A step's outputs for a thousand open streams wake a thousand stream tasks, whose chunks (encoded and sent)
    take tens of milliseconds of the event loop; put all at once, everything else the loop does (a /health probe,
    a new request) waits behind the rest of such a wave. A slice of SLICE streams per turn lets the rest in
    between (tests/test_async_llm.py: a probe waited behind up to 240 chunks at once, at most 121 in slices). Per
    stream the order is kept: one queue for everything the loop is handed, errors included."""

    SLICE = 64

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: AsyncLLM keeps these by loop, and the loop must be free to go
        self.pending: deque[tuple[_Stream, object]] = deque()
        self.draining = False

    def send(self, items: list[tuple[_Stream, object]]) -> None:
        """From any thread; RuntimeError if the loop is closed or gone."""
        loop = self._loop()
        if loop is None:
            raise RuntimeError("the event loop is gone")
        loop.call_soon_threadsafe(self._take, items)

    def _take(self, items: list[tuple[_Stream, object]]) -> None:
        self.pending.extend(items)
        if not self.draining:
            self.draining = True
            self._drain()

    def _drain(self) -> None:
        pending = self.pending
        for _ in range(min(self.SLICE, len(pending))):
            stream, item = pending.popleft()
            stream.queue.put_nowait(item)
        if pending:
            asyncio.get_running_loop().call_soon(self._drain)  # behind what became ready meanwhile, the woken stream tasks among it
        else:
            self.draining = False


@dataclass
class _Stream:
    request_id: str  # the caller's
    engine_id: str  # the engine's, this request's own (see generate)
    deliveries: _Deliveries
    queue: asyncio.Queue
    arrival: float
    processed: ProcessedRequest  # what the engine thread adds
    delta: bool
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def child_ids(self) -> list[str]:
        return [child.request_id for child in self.processed.children]


class AsyncLLM:
    """``AsyncLLM(model, **engine_kwargs)``, the same arguments as ``LLM``, plus ``max_queued_requests``:
    how many unfinished sequences it holds before new ones are refused with EngineOverloadedError, and
    ``engine_process``: on one device the engine core runs in a process of its own (the default), or in
    this one with False. On Ray each replica's core already runs in its driver actor. With
    ``engine_connection`` (several API servers) it is a client of an engine process started elsewhere, and
    ``observe_scheduler`` says whether this front end reports the engine's gauges and counters (one of
    them does, or /metrics would count them once per API server). ``engine``: an engine client made
    elsewhere (the Serve application's, whose engines are another deployment's replicas), and
    ``metrics_exporter``: where the metrics go (engine/metrics.py)."""

    def __init__(self, model: str, max_queued_requests: int = 4096, served_model_name: str | None = None,
                 engine_process: bool = True, engine_connection=None, observe_scheduler: bool = True,
                 engine: EngineClient | None = None, metrics_exporter=None, **engine_kwargs) -> None:
        self.config = build_engine_config(model, **engine_kwargs)
        self.processor = InputProcessor(self.config)
        self.tokenizer = self.processor.tokenizer
        self.model_name = served_model_name or model
        self.max_queued_requests = max_queued_requests
        # The step loop in a process of its own: this one's GIL is left to HTTP, tokenization and streaming.
        self.engine = engine or create_engine(self.config, self.processor.eos_token_ids, separate_process=engine_process,
                                              connection=engine_connection, grammars=self.processor.grammars)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.metrics = EngineMetrics(self.model_name, observe_scheduler=observe_scheduler, exporter=metrics_exporter)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        # The streams in flight by the engine's request id (the step loop delivers to them), and those whose caller
        # still reads them by the caller's id (an id is free again the moment its request is finished or aborted).
        self._engine_streams: dict[str, _Stream] = {}
        self._streams: dict[str, _Stream] = {}
        self._num_sequences = 0  # children of _engine_streams, kept with them under _streams_lock
        self._streams_lock = threading.Lock()
        # Each event loop that opens streams gets its deliveries; gone with the loop.
        self._deliveries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deliveries] = weakref.WeakKeyDictionary()
        self._ids = itertools.count()
        self._dead: BaseException | None = None
        # When the engine thread's current step began (None between steps), for the watchdog (``_watch``).
        self._step_since: float | None = None
        self._last_observed = self._last_timed = 0.0
        self._load_changed = False
        self._stopping = False
        # The thread holds only a weak reference, so that dropping the AsyncLLM ends the loop and garbage
        # collection releases the engine (and its Ray actors and placement groups).
        self._thread = threading.Thread(target=AsyncLLM._engine_loop, args=(weakref.ref(self),), name="raygrid-engine", daemon=True)
        self._thread.start()
        # So does the watchdog's (an engine stepping in this process only), woken at once when this goes (shutdown,
        # or collected).
        self._watchdog_stop = threading.Event()
        weakref.finalize(self, self._watchdog_stop.set)
        self._watchdog: threading.Thread | None = None
        if engine is None and engine_connection is None and not engine_process:
            watch_args = (weakref.ref(self), self._watchdog_stop, self.config.parallel.step_timeout_s)
            self._watchdog = threading.Thread(target=AsyncLLM._watch, args=watch_args, name="raygrid-engine-watchdog",
                                              daemon=True)
            self._watchdog.start()

    # ------------------------------------------------------------------ the asyncio side

    @property
    def is_healthy(self) -> bool:
        """The engine loop runs and (on Ray) at least one replica is in service."""
        replicas_ok = any(self.engine.healthy)
        return self._dead is None and self._thread.is_alive() and replicas_ok

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._engine_streams)

    def _deliveries_for(self, loop: asyncio.AbstractEventLoop) -> _Deliveries:
        with self._streams_lock:
            deliveries = self._deliveries.get(loop)
            if deliveries is None:
                deliveries = self._deliveries[loop] = _Deliveries(loop)
            return deliveries

    async def generate(
        self,
        prompt: PromptType,
        sampling_params: SamplingParams,
        request_id: str | None = None,
        priority: int = 0,
        delta: bool = False,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs: cumulative ones, or with ``delta=True`` only what is new (text with
        stop-string hold-back). Raises ValueError for a request the engine cannot take. A request stopped by ``abort``
        ends its stream with a last output whose completions finish with "abort" (vLLM's AsyncLLM does the same)."""
        if self._dead is not None:
            raise EngineDeadError(f"engine loop failed: {self._dead!r}")
        if self.engine.lost:
            raise EngineDeadError("no engine is left to serve: the engine process died or stopped making progress")
        in_flight = self._num_sequences  # sequences, not prompts: n=128 is 128 of them
        if in_flight + sampling_params.n > self.max_queued_requests:
            raise EngineOverloadedError(
                f"{in_flight} sequences in flight and {sampling_params.n} more asked for: max_queued_requests is "
                f"{self.max_queued_requests}"
            )
        # The engine's id for this request. A caller's id may come back once its request is gone, while outputs of
        # the one before (aborted mid-step) are still on their way from the engine: each gets an id of its own.
        engine_id = f"req-{next(self._ids)}" if request_id is None else f"{request_id}#{next(self._ids)}"
        request_id = engine_id if request_id is None else request_id
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt and sampling_params.structured_outputs is None:
            processed = self.processor.process(engine_id, prompt, sampling_params, priority=priority)
        else:  # tokenizing text, or compiling a grammar, takes a while: off the caller's event loop
            processed = await asyncio.to_thread(self.processor.process, engine_id, prompt, sampling_params, priority=priority)
        stream = _Stream(request_id, engine_id, self._deliveries_for(asyncio.get_running_loop()), asyncio.Queue(), time.monotonic(),
                         processed, delta)
        with self._streams_lock:
            if self._dead is not None:  # set before _die takes the streams under this lock: none is left behind
                raise EngineDeadError(f"engine loop failed: {self._dead!r}")
            if request_id in self._streams:
                raise ValueError(f"request_id {request_id!r} is already in flight")
            self._streams[request_id] = self._engine_streams[engine_id] = stream
            self._num_sequences += len(stream.child_ids)
            # Queued under the lock, so that no abort of this stream (which takes it out under the lock) comes first.
            self._commands.put(("add", stream))
        self.metrics.prompt_tokens.inc(len(processed.prompt_token_ids) * len(processed.children))
        finished = False
        try:
            while True:
                item = await stream.queue.get()
                # Outputs that queued up while the consumer was busy go out as one: a consumer that falls
                # behind sends fewer, larger chunks instead of falling further behind.
                while delta and not stream.queue.empty() and isinstance(item, RequestOutput) and not item.finished:
                    later = stream.queue.get_nowait()
                    if isinstance(later, BaseException):
                        item = later
                        break
                    item.add(later)
                if isinstance(item, BaseException):
                    raise EngineDeadError(f"the engine failed while serving this request: {item!r}") from item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self._cancel(stream)

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks; safe to call from any thread, for any id. It stops the request in
        flight under that id when called (a no-op for one that has finished), and the id is free again at once. The
        request's stream gets a last output, finished with "abort", holding what it had not yet been sent."""
        with self._streams_lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._commands.put(("abort", stream))

    def _cancel(self, stream: _Stream) -> None:
        """``abort`` for this stream alone: its id may belong to a later request already."""
        with self._streams_lock:
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]
        self._commands.put(("abort", stream))

    def render_metrics(self) -> bytes | None:
        return self.metrics.render()

    def shutdown(self) -> None:
        self._stopping = True
        self._watchdog_stop.set()
        self._commands.put(("stop",))
        self._thread.join(timeout=30)
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
        self.engine.shutdown()

    # ------------------------------------------------------------------ the engine thread

    @staticmethod
    def _engine_loop(ref: weakref.ref) -> None:
        while (self := ref()) is not None and not self._stopping and self._dead is None:
            try:
                self._iteration()
            except Exception as error:  # noqa: BLE001 - fail what is in flight, keep serving
                logger.exception("engine loop iteration failed; failing the requests in flight")
                self._fail_in_flight(error)
            except BaseException as error:
                self._die(error)
                return
            del self

    @staticmethod
    def _watch(ref: weakref.ref, stop: threading.Event, step_timeout_s: float) -> None:
        """The watchdog's thread: an engine whose step has not returned after twice ``step_timeout_s`` is dead (a GPU
        that stopped, a collective that never completes). Its requests fail with the reason and /health turns false,
        so that an orchestrator restarts the server; the hung thread cannot be stopped, and once (if ever) its step
        returns, the loop ends. It runs for an engine stepping in this process only: the client of an engine process
        or of Ray replicas returns from its step every 0.1 s while it waits and fails a silent engine itself after
        ``step_timeout_s``, and the executor of an engine in this process whose workers are Ray actors fails a worker
        silent that long before this fires (twice ``step_timeout_s``, as the Ray front end's deadline for a replica's
        driver)."""
        timeout = 2 * step_timeout_s
        while not stop.wait(min(1.0, timeout / 4)):
            self = ref()
            if self is None or self._dead is not None:
                return
            since = self._step_since
            if since is not None and time.monotonic() - since > timeout:
                self._die(EngineDeadError(f"the engine made no progress for {time.monotonic() - since:.0f} s: a step "
                                          f"has not returned in 2 x step_timeout_s ({timeout:g} s)"))
                return
            del self

    def _die(self, error: BaseException) -> None:
        """Report to every waiting client rather than hang them; the engine serves no more."""
        logger.exception("engine loop failed", exc_info=error)
        self._dead = error
        for stream in self._take_all_streams().values():
            self._deliver(stream, error)

    def _iteration(self) -> None:
        idle = not self.engine.has_unfinished_requests()
        if idle:
            self._observe_scheduler(force=True)  # the gauges settle at their idle values
        self._apply_commands(block=idle)
        if not self._stopping and self.engine.has_unfinished_requests():
            self._step()

    def _take_all_streams(self) -> dict[str, _Stream]:
        with self._streams_lock:
            streams, self._engine_streams, self._streams, self._num_sequences = self._engine_streams, {}, {}, 0
        return streams

    def _forget_stream(self, stream: _Stream) -> bool:
        """Stop delivering to a stream; False if it was forgotten already (finished, or aborted)."""
        with self._streams_lock:
            if self._engine_streams.pop(stream.engine_id, None) is None:
                return False
            if self._streams.get(stream.request_id) is stream:
                del self._streams[stream.request_id]
            self._num_sequences -= len(stream.child_ids)
        return True

    def _fail_in_flight(self, error: Exception) -> None:
        for stream in self._take_all_streams().values():
            self.engine.abort_requests(stream.child_ids)
            self.output_processor.abort(stream.engine_id)
            self._deliver(stream, error)

    @staticmethod
    def _deliver(stream: _Stream, item) -> bool:
        """Hand an item to the stream's event loop; False if that loop is gone (its client with it)."""
        try:
            stream.deliveries.send([(stream, item)])
            return True
        except RuntimeError:  # event loop closed
            return False

    def _apply_commands(self, block: bool) -> None:
        for kind, *payload in drain(self._commands, 0.5 if block else None):
            if kind == "add":
                self._add(*payload)
            elif kind == "abort":
                self._abort(*payload)
            elif kind == "stop":
                return

    def _add(self, stream: _Stream) -> None:
        if stream.engine_id not in self._engine_streams:
            return  # failed before the engine saw the request (_fail_in_flight)
        self.output_processor.add_request(stream.processed, delta=stream.delta)
        for child in stream.processed.children:
            self.engine.add_request(child)
        self._load_changed = True

    def _abort(self, stream: _Stream) -> None:
        """Stop the stream's request and end the stream with its last output. Where the stream's consumer has gone
        (``_cancel``), nothing reads it."""
        if not self._forget_stream(stream):
            return
        self.engine.abort_requests(stream.child_ids)
        final = self.output_processor.abort(stream.engine_id)
        if final is not None:  # always, as the add is queued before any abort of the stream can be (generate)
            self.metrics.observe_finished("abort")
            final.request_id = stream.request_id  # the caller's, not the engine's
            self._deliver(stream, final)
        self._observe_scheduler(force=True)

    def _step(self) -> None:
        self._step_since = time.monotonic()
        try:
            core_outputs = self.engine.step()
        finally:
            self._step_since = None
        if self._dead is not None:  # the watchdog gave this step up: its streams were failed and forgotten
            return
        now = time.monotonic()
        self._observe_tokens(core_outputs, now)  # before process(), which forgets finished requests
        outputs, to_abort = self.output_processor.process(core_outputs)
        if to_abort:
            self.engine.abort_requests(to_abort)
        batches: dict[_Deliveries, list[tuple[_Stream, RequestOutput]]] = {}
        for output in outputs:
            stream = self._engine_streams.get(output.request_id)
            if stream is None or (output.finished and not self._forget_stream(stream)):
                continue
            output.request_id = stream.request_id  # the caller's, not the engine's
            if output.finished:
                self.metrics.e2e_latency.observe(now - stream.arrival)
                for completion in output.outputs:
                    if completion.finish_reason:
                        self.metrics.observe_finished(completion.finish_reason)
            batches.setdefault(stream.deliveries, []).append((stream, output))
        for deliveries, batch in batches.items():
            # One wake-up of each event loop per step, not one per stream: that was most of this thread's cost.
            try:
                deliveries.send(batch)
            except RuntimeError:  # that event loop is closed, its clients with it
                for stream, output in batch:
                    if not output.finished:
                        self._cancel(stream)
        self._load_changed |= any(output.finished for output in outputs)
        self._observe_scheduler(force=self._load_changed)

    def _observe_scheduler(self, force: bool = False) -> None:
        """Refresh the scheduler gauges and counters: when requests came or went, otherwise at most
        every 0.25 s; the step times every 5 s (on Ray, reading them is a round trip to every replica)."""
        now = time.monotonic()
        if force or now - self._last_observed >= 0.25:
            self._last_observed = now
            self._load_changed = False
            self.metrics.observe_scheduler(self.engine.stats())
            self.metrics.observe_replicas(self.engine.healthy)
        if self.metrics.observes_scheduler and now - self._last_timed >= 5.0:
            self._last_timed = now
            self.metrics.observe_step_timing(self.engine.step_timing())

    def _observe_tokens(self, core_outputs: list[EngineCoreOutput], now: float) -> None:
        new_tokens = 0
        for out in core_outputs:
            if not out.new_token_ids:
                continue
            new_tokens += len(out.new_token_ids)
            parent_id = self.output_processor.parent_of.get(out.req_id, out.req_id)
            stream = self._engine_streams.get(parent_id)
            if stream is None:
                continue
            if stream.first_token_time is None:
                stream.first_token_time = now
                self.metrics.time_to_first_token.observe(now - stream.arrival)
            elif stream.last_token_time is not None:
                self.metrics.inter_token_latency.observe(now - stream.last_token_time)
            stream.last_token_time = now
            if out.queue_time is not None:
                self.metrics.queue_time.observe(out.queue_time)
        if new_tokens:  # one counter update a step (with several API servers each is a locked file write)
            self.metrics.generation_tokens.inc(new_tokens)
