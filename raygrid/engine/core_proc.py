"""The engine core in its own process, as vLLM v1's EngineCoreProc: the scheduler and the step loop get a
Python interpreter (and GIL) of their own, and the API process keeps HTTP, tokenization, detokenization and
streaming.

Two ZeroMQ PUSH/PULL pipes over IPC sockets carry pickled messages. To the engine: ("add", [Request]),
("abort", [request id]), ("shutdown",). From the engine: ("ready", stats) once the model is loaded, then one
("outputs", [EngineCoreOutput], stats, step timing) per step, carrying every request's new tokens; ("error", text) if
the engine cannot start. The engine runs its loop on its own: while it has requests it steps, otherwise it
waits for messages. It exits when told to, or when the process that started it is gone.

``EngineProcClient`` is the API side and an ``EngineClient``: if the engine process dies, every request in
flight comes back failed at the next ``step()``, and the client reports itself unhealthy.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import tempfile
import time
import uuid
import weakref

import zmq

from raygrid.config import EngineConfig
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats

logger = logging.getLogger(__name__)

_POLL_MS = 100  # how long step() waits for outputs before checking on the engine process


def _dumps(message) -> bytes:
    return pickle.dumps(message, protocol=5)


class _Orphaned(Exception):
    pass


def _send(outbox, message, parent_pid: int) -> None:
    """Send, waiting while the API process is slow to read, but never for a dead one."""
    while not outbox.poll(1000, zmq.POLLOUT):
        if os.getppid() != parent_pid:
            raise _Orphaned
    outbox.send(_dumps(message))


def run_engine_proc(config: EngineConfig, eos_token_ids: frozenset[int], to_engine: str, from_engine: str, parent_pid: int) -> None:
    """The engine process's main: build the engine core, then step while there is work."""
    context = zmq.Context()
    inbox, outbox = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    inbox.connect(to_engine)
    outbox.connect(from_engine)
    try:
        _serve(config, eos_token_ids, inbox, outbox, parent_pid)
    except _Orphaned:
        pass
    finally:
        inbox.close(linger=0)
        outbox.close(linger=0)
        context.term()


def _serve(config: EngineConfig, eos_token_ids: frozenset[int], inbox, outbox, parent_pid: int) -> None:
    try:
        from raygrid.engine.core import EngineCore

        core = EngineCore(config, eos_token_ids)
    except BaseException as error:  # noqa: BLE001 - the API process reports it
        _send(outbox, ("error", f"{type(error).__name__}: {error}"), parent_pid)
        time.sleep(0.5)  # let the message leave before the sockets close
        return
    _send(outbox, ("ready", core.stats()), parent_pid)
    try:
        while True:
            busy = core.has_unfinished_requests()
            if inbox.poll(0 if busy else 1000):
                while True:
                    kind, *payload = pickle.loads(inbox.recv())
                    if kind == "shutdown":
                        return
                    if kind == "add":
                        for request in payload[0]:
                            core.add_request(request)
                    elif kind == "abort":
                        core.abort_requests(payload[0])
                    if not inbox.poll(0):
                        break
            elif os.getppid() != parent_pid:
                return  # orphaned: the API process is gone
            if core.has_unfinished_requests():
                outputs = core.step()
                _send(outbox, ("outputs", outputs, core.stats(), core.step_timing()), parent_pid)
            elif busy:  # the last requests were aborted: the counters went back to idle
                _send(outbox, ("outputs", [], core.stats(), core.step_timing()), parent_pid)
    finally:
        core.shutdown()


class EngineProcClient:
    """Starts the engine process and talks to it; see the module docstring."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], start_timeout_s: float = 1800.0) -> None:
        base = os.path.join(tempfile.gettempdir(), f"raygrid-{uuid.uuid4().hex[:12]}")
        to_engine, from_engine = f"ipc://{base}-in", f"ipc://{base}-out"
        self._context = zmq.Context()
        self._outbox, self._inbox = self._context.socket(zmq.PUSH), self._context.socket(zmq.PULL)
        self._outbox.bind(to_engine)
        self._inbox.bind(from_engine)
        # spawn: a fresh interpreter, safe with CUDA and threads in this one
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_proc, args=(config, eos_token_ids, to_engine, from_engine, os.getpid()),
            name="raygrid-engine-core", daemon=True,
        )
        self.process.start()
        # However this client ends (shutdown(), garbage collection, interpreter exit), the process goes too.
        self._finalizer = weakref.finalize(self, _stop_engine_proc, self.process, self._context, self._outbox, self._inbox,
                                           [f"{base}-in", f"{base}-out"])
        self._unfinished: set[str] = set()
        self._dead: str | None = None
        self._stats = SchedulerStats()
        self._timing: list[dict[str, float]] = []
        self._pending: list[EngineCoreOutput] = []
        try:
            self._wait_until_ready(start_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._inbox.poll(_POLL_MS):
            if not self.process.is_alive():
                raise RuntimeError(f"the engine process exited while starting (exit code {self.process.exitcode})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine process did not start within {timeout_s:g} s")
        kind, payload = pickle.loads(self._inbox.recv())
        if kind == "error":
            raise RuntimeError(f"the engine process could not start: {payload}")
        self._stats = payload

    # ------------------------------------------------------------------ EngineClient

    @property
    def healthy(self) -> list[bool]:
        return [self._dead is None and self.process.is_alive()]

    def add_request(self, request: Request) -> None:
        if self._dead is not None:
            raise RuntimeError(f"the engine process is gone ({self._dead})")
        self._unfinished.add(request.request_id)
        self._outbox.send(_dumps(("add", [request])))

    def abort_requests(self, request_ids) -> None:
        ids = [r for r in request_ids if r in self._unfinished]
        if ids and self._dead is None:
            self._unfinished.difference_update(ids)
            self._outbox.send(_dumps(("abort", ids)))

    def has_unfinished_requests(self) -> bool:
        return bool(self._unfinished)

    def step(self) -> list[EngineCoreOutput]:
        if self._dead is not None:
            return []
        if not self._pending and not self._receive(_POLL_MS) and not self.process.is_alive():
            return self._fail_all(f"the engine process died (exit code {self.process.exitcode})")
        outputs, self._pending = self._pending, []
        for out in outputs:
            if out.finished:
                self._unfinished.discard(out.req_id)
        return outputs

    def _receive(self, wait_ms: int) -> bool:
        """Take in every message that is there (several steps' when the front end fell behind), waiting up to
        ``wait_ms`` for the first; outputs wait in ``_pending`` for step()."""
        if not self._inbox.poll(wait_ms):
            return False
        while True:
            _, step_outputs, self._stats, self._timing = pickle.loads(self._inbox.recv())
            self._pending.extend(step_outputs)
            if not self._inbox.poll(0):
                return True

    def _fail_all(self, reason: str) -> list[EngineCoreOutput]:
        logger.error("%s; failing %d request(s) in flight", reason, len(self._unfinished))
        self._dead = reason
        failed = [EngineCoreOutput(rid, [], [], finish_reason="abort", error=reason) for rid in sorted(self._unfinished)]
        self._unfinished.clear()
        return failed

    def stats(self) -> SchedulerStats:
        if self._dead is None:
            self._receive(0)
        return self._stats

    def step_timing(self) -> list[dict[str, float]]:
        return self._timing

    def shutdown(self) -> None:
        self._finalizer()


def _stop_engine_proc(process, context, outbox, inbox, socket_paths: list[str]) -> None:
    if process.is_alive():
        try:
            outbox.send(_dumps(("shutdown",)), flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    outbox.close(linger=0)
    inbox.close(linger=0)
    context.term()
    for path in socket_paths:
        try:
            os.unlink(path)
        except OSError:
            pass
