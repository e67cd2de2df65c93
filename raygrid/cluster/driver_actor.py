"""DriverActor: one replica's engine core (scheduler + RayExecutor) as a Ray actor, stepping on its own
(under expert parallelism the replica is a world of DP ranks: a DataParallelEngine).

The step loop runs on a thread of the actor and never waits for the front end: while it has requests it
steps, and each step's outputs queue up until the front end collects them. The front end talks to it with
one call at a time, ``exchange(new_requests, aborts)``: it hands over what arrived and returns the outputs
queued since the last exchange (waiting a moment for some if none are), with the scheduler's counters. So
the round trip to the front end overlaps the steps instead of adding to each one. Everything that touches
the engine core runs on the loop thread, between steps; the actor's call threads only pass messages.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

import ray

from raygrid.cluster.ray_executor import RayExecutor
from raygrid.config import EngineConfig
from raygrid.engine.dp_engine import make_engine_core
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats
from raygrid.engine.structured_output import GrammarCompiler
from raygrid.placement.placement import WorkerSlot

logger = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.5  # how long the idle loop sleeps on its inbox before looking again


@ray.remote(num_cpus=0, max_concurrency=4)  # threaded: exchanges and queries are answered while the loop steps
class DriverActor:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], replica: int, slots: list[WorkerSlot],
                 grammars: GrammarCompiler | None = None) -> None:
        """``grammars``: the front end's compiler, pickled with its tokenizer (without one, the driver loads the
        tokenizer through transformers at the first grammar)."""
        self.executor = RayExecutor(config, eos_token_ids, slots, replica)
        try:
            self.core = make_engine_core(config, eos_token_ids, self.executor, grammars)
        except BaseException:
            self.executor.shutdown()
            raise
        self._inbox: queue.SimpleQueue[tuple[Callable[[], Any], Future | None]] = queue.SimpleQueue()
        self._ready = threading.Condition()
        self._outputs: list[EngineCoreOutput] = []
        self._stats = self.core.stats()
        self._error: BaseException | None = None
        self._stopping = False
        self._loop = threading.Thread(target=self._run, name=f"raygrid-replica{replica}-steps", daemon=True)
        self._loop.start()

    # ------------------------------------------------------------------ the loop thread

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._apply_inbox(wait=not self.core.has_unfinished_requests())
                if self.core.has_unfinished_requests():
                    outputs = self.core.step()
                    with self._ready:
                        self._outputs.extend(outputs)
                        self._stats = self.core.stats()
                        self._ready.notify_all()
        except BaseException as error:  # noqa: BLE001 - a lost replica: every exchange from now on raises it
            logger.exception("replica step loop stopped")
            with self._ready:
                self._error = error
                self._ready.notify_all()
            self._fail_inbox(error)

    def _apply_inbox(self, wait: bool) -> None:
        """Run what the call threads queued (adds, aborts, queries), in order; ``wait``: the loop is idle,
        so sleep until something arrives."""
        try:
            fn, future = self._inbox.get(timeout=_IDLE_WAIT_S) if wait else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                result = fn()
            except Exception as error:  # noqa: BLE001 - the caller gets it
                if future is None:
                    raise
                future.set_exception(error)
            else:
                if future is not None:
                    future.set_result(result)
            try:
                fn, future = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _fail_inbox(self, error: BaseException) -> None:
        while True:
            try:
                _, future = self._inbox.get_nowait()
            except queue.Empty:
                return
            if future is not None:
                future.set_exception(error)

    def _on_loop(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the loop thread between steps and return its result."""
        if self._error is not None:
            raise self._error
        future: Future = Future()
        self._inbox.put((fn, future))
        return future.result()

    # ------------------------------------------------------------------ calls from the front end

    def exchange(self, new_requests: list[Request], aborts: list[str], wait_s: float = 0.1) -> tuple[list[EngineCoreOutput], SchedulerStats]:
        """Hand over what arrived; return the outputs of the steps since the last exchange (waiting up to
        ``wait_s`` for the first) and the scheduler's counters as of the last step."""
        if new_requests or aborts:
            self._inbox.put((lambda: self._admit(new_requests, aborts), None))
        with self._ready:
            self._ready.wait_for(lambda: self._outputs or self._error is not None, timeout=wait_s)
            if self._error is not None:
                raise self._error
            outputs, self._outputs = self._outputs, []
            return outputs, self._stats

    def _admit(self, new_requests: list[Request], aborts: list[str]) -> None:
        for request in new_requests:
            self.core.add_request(request)
        if aborts:
            self.core.abort_requests(aborts)

    def stats(self) -> SchedulerStats:
        return self._stats

    def step_timing(self) -> dict[str, float]:
        return self._on_loop(lambda: self.core.step_timing()[0])

    def worker_names(self) -> list[str]:
        return self.executor.worker_names()

    def pid(self) -> int:
        return os.getpid()

    def transport(self) -> str:
        """How steps reach the workers: "compiled graph" or "actor calls"."""
        return self.executor.transport

    def reset_prefix_cache(self) -> bool:
        return self._on_loop(self.core.reset_prefix_cache)

    def collective_rpc(self, method: str, args: tuple = ()) -> list[Any]:
        """``method`` on every worker of the replica, between steps (reports, say)."""
        return self._on_loop(lambda: self.executor.collective_rpc(method, args))

    def shutdown(self) -> None:
        self._stopping = True
        self._loop.join(timeout=30)
        self.core.shutdown()
