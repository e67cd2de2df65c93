"""The engine core in its own process, as vLLM v1's EngineCoreProc: the scheduler and the step loop get a
Python interpreter (and GIL) of their own, and the API processes keep HTTP, tokenization, detokenization
and streaming.

``EngineProc`` owns the process. It serves one or more clients (``--api-server-count``), each with a pair
of ZeroMQ PUSH/PULL pipes over IPC sockets carrying pickled messages. To the engine: ("add", client,
[Request]) and ("abort", [request id]). From the engine, to each client: ("ready", stats) once the model is
loaded, then one ("outputs", [EngineCoreOutput], stats, step timing, replica health) per step, carrying
every new token of that client's requests (the outputs as MessagePack inside the pickle: msgspec decodes
a step of 256 outputs in about 45 us, pickle in about 300); ("error", text) if the engine cannot start. The engine process
hosts an EngineCore, or the Ray data-parallel front end when distributed. It steps while it has requests,
otherwise it waits for messages, and exits on SIGTERM from its owner or when its parent is gone.

``EngineProcClient`` is the API side and an ``EngineClient``. It owns its engine process, or connects to
one that another process owns (several API servers). If the engine process dies, every request in flight
comes back failed at the next ``step()``, and the client reports itself unhealthy. So it does if the engine
process hangs (stopped, or stuck in a step): while the client has requests in flight the engine reports every
step, and a silence of ``step_timeout_s`` fails them all; an engine process the client owns is then killed, since
it holds the device.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from raygrid.config import EngineConfig
from raygrid.engine.outputs import EngineCoreOutput, decode_outputs, encode_outputs
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats

if TYPE_CHECKING:
    from raygrid.engine.structured_output import GrammarCompiler

logger = logging.getLogger(__name__)

_POLL_MS = 100  # how long step() waits for outputs before checking on the engine process


@dataclass(frozen=True)
class EngineConnection:
    """What a client needs to reach an engine process: its index among the clients, its two IPC addresses,
    and the engine's pid (to notice its death)."""

    index: int
    to_engine: str
    from_engine: str
    engine_pid: int


def _dumps(message) -> bytes:
    return pickle.dumps(message, protocol=5)


class _Orphaned(Exception):
    pass


def _send(outbox, message, parent_pid: int) -> None:
    """Send, waiting while an API process is slow to read, but never for a dead one."""
    while not outbox.poll(1000, zmq.POLLOUT):
        if os.getppid() != parent_pid:
            raise _Orphaned
    outbox.send(_dumps(message))


def run_engine_proc(config: EngineConfig, eos_token_ids: frozenset[int], to_engine: list[str], from_engine: list[str],
                    parent_pid: int, grammars: GrammarCompiler | None = None) -> None:
    """The engine process's main: build the engine core, then step while there is work. The clients bind the
    addresses; one PULL socket connects to all of theirs (fair-queued), one PUSH socket to each."""
    # SIGTERM is how the owner stops this process; Ctrl-C in a terminal reaches the whole process group,
    # and the API servers, not this process, decide when serving ends.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    for address in to_engine:
        inbox.connect(address)
    outboxes = [context.socket(zmq.PUSH) for _ in from_engine]
    for outbox, address in zip(outboxes, from_engine):
        outbox.connect(address)
    try:
        _serve(config, eos_token_ids, inbox, outboxes, parent_pid, grammars)
    except _Orphaned:
        pass
    finally:
        for sock in (inbox, *outboxes):
            sock.close(linger=0)
        context.term()


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def _serve(config: EngineConfig, eos_token_ids: frozenset[int], inbox, outboxes: list, parent_pid: int,
           grammars: GrammarCompiler | None) -> None:
    try:
        from raygrid.engine.engine_client import create_engine

        # an EngineCore, or the Ray data-parallel front end
        core = create_engine(config, eos_token_ids, grammars=grammars)
    except BaseException as error:  # noqa: BLE001 - the API processes report it
        for outbox in outboxes:
            _send(outbox, ("error", f"{type(error).__name__}: {error}"), parent_pid)
        time.sleep(0.5)  # let the messages leave before the sockets close
        return
    for outbox in outboxes:
        _send(outbox, ("ready", core.stats()), parent_pid)
    owner: dict[str, int] = {}  # request id -> the client that added it
    try:
        while True:
            busy = core.has_unfinished_requests()
            if inbox.poll(0 if busy else 1000):
                while True:
                    kind, *payload = pickle.loads(inbox.recv())
                    if kind == "add":
                        client, requests = payload
                        for request in requests:
                            owner[request.request_id] = client
                            core.add_request(request)
                    elif kind == "abort":
                        for request_id in payload[0]:
                            owner.pop(request_id, None)
                        core.abort_requests(payload[0])
                    if not inbox.poll(0):
                        break
            elif os.getppid() != parent_pid:
                return  # orphaned: the process that started this one is gone
            if core.has_unfinished_requests():
                by_client: list[list[EngineCoreOutput]] = [[] for _ in outboxes]
                for out in core.step():
                    client = owner.pop(out.req_id, 0) if out.finished else owner.get(out.req_id, 0)
                    by_client[client].append(out)
                _publish(core, outboxes, by_client, parent_pid)
            elif busy:  # the last requests were aborted: the counters went back to idle
                _publish(core, outboxes, [[] for _ in outboxes], parent_pid)
    finally:
        core.shutdown()


def _publish(core, outboxes: list, by_client: list[list[EngineCoreOutput]], parent_pid: int) -> None:
    """One message a client for this step. Every client hears of every step, with or without outputs of its
    own, so its gauges stay current; the counters are read once for all of them."""
    status = (core.stats(), core.step_timing(), core.healthy)
    for outbox, outputs in zip(outboxes, by_client):
        _send(outbox, ("outputs", encode_outputs(outputs), *status), parent_pid)


class EngineProc:
    """Starts the engine process for ``num_clients`` clients and stops it on ``shutdown()``, on garbage
    collection or at interpreter exit. ``connections`` are what each client connects with. ``grammars``: the
    front end's grammar compiler, which goes over pickled with its tokenizer's JSON, so that the engine process
    (and a Ray engine's drivers) build llguidance's tokenizer without loading one through transformers."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], num_clients: int = 1,
                 grammars: GrammarCompiler | None = None) -> None:
        base = os.path.join(tempfile.gettempdir(), f"raygrid-{uuid.uuid4().hex[:12]}")
        to_engine = [f"ipc://{base}-in{i}" for i in range(num_clients)]
        from_engine = [f"ipc://{base}-out{i}" for i in range(num_clients)]
        # spawn: a fresh interpreter, safe with CUDA and threads in this one
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_proc, args=(config, eos_token_ids, to_engine, from_engine, os.getpid(), grammars),
            name="raygrid-engine-core", daemon=True,
        )
        self.process.start()
        self.connections = [EngineConnection(i, to_engine[i], from_engine[i], self.process.pid) for i in range(num_clients)]
        paths = [address.removeprefix("ipc://") for address in to_engine + from_engine]
        self._finalizer = weakref.finalize(self, _stop_engine_proc, self.process, paths)

    def is_alive(self) -> bool:
        return self.process.is_alive()

    def shutdown(self) -> None:
        self._finalizer()


def _stop_engine_proc(process, socket_paths: list[str]) -> None:
    """SIGTERM (the engine leaves its loop and releases the device), then SIGKILL after 30 s."""
    if process.is_alive():
        process.terminate()
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
    for path in socket_paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _pid_alive(pid: int) -> bool:
    """Whether a process that is not our child still runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


class EngineProcClient:
    """The API side of an engine process; see the module docstring. Without ``connection`` it starts an
    engine process of its own (and owns it); with one it connects to another process's engine."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], start_timeout_s: float = 1800.0,
                 connection: EngineConnection | None = None, grammars: GrammarCompiler | None = None) -> None:
        self._owned = EngineProc(config, eos_token_ids, grammars=grammars) if connection is None else None
        self.connection = connection or self._owned.connections[0]
        self._context = zmq.Context()
        self._outbox, self._inbox = self._context.socket(zmq.PUSH), self._context.socket(zmq.PULL)
        self._outbox.bind(self.connection.to_engine)
        self._inbox.bind(self.connection.from_engine)
        # However this client ends (shutdown(), garbage collection, interpreter exit), its sockets close and
        # the engine process it owns stops.
        self._finalizer = weakref.finalize(self, _close_client, self._context, self._outbox, self._inbox, self._owned)
        self._unfinished: set[str] = set()
        self._dead: str | None = None
        self._stats = SchedulerStats()
        self._timing: list[dict[str, float]] = []
        self._replicas_healthy = [True]
        self._last_heard = 0.0
        self._step_timeout_s = config.parallel.step_timeout_s
        self._waiting_since = 0.0  # since when requests in flight have had no word from the engine
        self._pending: list[EngineCoreOutput] = []
        try:
            self._wait_until_ready(start_timeout_s)
        except BaseException:
            self.shutdown()
            raise

    def _engine_alive(self) -> bool:
        if time.monotonic() - self._last_heard < 0.1:
            return True  # it spoke a moment ago: no need to ask the kernel on every request
        return self._owned.is_alive() if self._owned is not None else _pid_alive(self.connection.engine_pid)

    def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self._inbox.poll(_POLL_MS):
            if not self._engine_alive():
                code = f" (exit code {self._owned.process.exitcode})" if self._owned is not None else ""
                raise RuntimeError(f"the engine process exited while starting{code}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine process did not start within {timeout_s:g} s")
        kind, payload = pickle.loads(self._inbox.recv())
        if kind == "error":
            raise RuntimeError(f"the engine process could not start: {payload}")
        self._stats = payload

    # ------------------------------------------------------------------ EngineClient

    @property
    def healthy(self) -> list[bool]:
        alive = self._dead is None and self._engine_alive()
        return [alive and ok for ok in self._replicas_healthy]

    @property
    def lost(self) -> bool:
        return not any(self.healthy)

    def add_request(self, request: Request) -> None:
        if self._dead is not None:
            raise RuntimeError(f"the engine process is gone ({self._dead})")
        if not self._unfinished:  # the engine was idle and silent: its silence counts from now
            self._waiting_since = time.monotonic()
        self._unfinished.add(request.request_id)
        self._outbox.send(_dumps(("add", self.connection.index, [request])))

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
        if not self._pending and not self._receive(_POLL_MS):
            if not self._engine_alive():
                return self._fail_all("the engine process died")
            silent_s = time.monotonic() - max(self._last_heard, self._waiting_since)
            if self._unfinished and silent_s > self._step_timeout_s:
                self._kill_engine()
                return self._fail_all(f"the engine process made no progress for {silent_s:.0f} s (step_timeout_s "
                                      f"{self._step_timeout_s:g})")
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
        self._last_heard = time.monotonic()
        while True:
            _, step_outputs, self._stats, self._timing, self._replicas_healthy = pickle.loads(self._inbox.recv())
            self._pending.extend(decode_outputs(step_outputs))
            if not self._inbox.poll(0):
                return True

    def _kill_engine(self) -> None:
        """SIGKILL a hung engine process: it holds the device, and a stopped process does not act on SIGTERM. One
        that another process owns goes too: every client of it finds it hung, and its owner then sees it exit."""
        try:
            os.kill(self.connection.engine_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _fail_all(self, reason: str) -> list[EngineCoreOutput]:
        if self._owned is not None and self._owned.process.exitcode is not None:
            reason += f" (exit code {self._owned.process.exitcode})"
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


def _close_client(context, outbox, inbox, owned: EngineProc | None) -> None:
    if owned is not None:
        owned.shutdown()
    outbox.close(linger=0)
    inbox.close(linger=0)
    context.term()
