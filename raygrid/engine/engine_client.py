"""The one interface between front ends (LLM, AsyncLLM, the server) and engines.

Four implementations: ``EngineCore`` in this process (offline ``LLM``), ``EngineProcClient`` for an engine
core in its own process over ZeroMQ (``AsyncLLM`` on one device), ``RayEngineClient`` for data-parallel
replicas on Ray (each replica's engine core runs in its DriverActor's process), and the Serve application's
``ServeEngineClient`` (serve/engine_client.py: each request a streaming call to an EngineServer replica). A front end adds and
aborts requests, calls ``step()`` for the next outputs, and reads health and counters; nothing else.
``create_engine`` picks the implementation for a configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from raygrid.config import EngineConfig
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats

if TYPE_CHECKING:
    from raygrid.engine.structured_output import GrammarCompiler


@runtime_checkable
class EngineClient(Protocol):
    def add_request(self, request: Request) -> None:
        """Queue a request (one child of a prompt); raises RuntimeError when the engine is lost."""

    def abort_requests(self, request_ids) -> None:
        """Stop requests and free their KV blocks; unknown or finished ids are ignored."""

    def step(self) -> list[EngineCoreOutput]:
        """The next outputs: one engine step's worth, or an empty list after a short wait. A request that
        failed in the engine comes back finished, with ``error`` set."""

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> SchedulerStats:
        """Scheduler and KV cache counters as of the last step."""

    def step_timing(self) -> list[dict[str, float]]:
        """Per replica: steps so far, mean seconds a step as the engine and as the output worker saw it."""

    @property
    def healthy(self) -> list[bool]:
        """Per replica: is it in service now (on Ray, a failed replica being rebuilt is not)."""

    @property
    def lost(self) -> bool:
        """True once the engine can serve no more (its process died); a replica being rebuilt is not lost."""

    def shutdown(self) -> None:
        """Release every process, actor, device buffer and reservation; safe to call twice."""


def create_engine(config: EngineConfig, eos_token_ids: frozenset[int], separate_process: bool = False,
                  connection=None, grammars: GrammarCompiler | None = None) -> EngineClient:
    """The engine for this configuration: with a ``connection`` (a core_proc.EngineConnection), a client of
    an engine process that another process started; on Ray for several devices (each replica's core runs
    in its driver actor's process); for one device in this process, or with ``separate_process`` in a
    process of its own. ``grammars``: the caller's grammar compiler, which an engine in this process shares and
    an engine elsewhere gets a copy of."""
    if connection is not None:
        from raygrid.engine.core_proc import EngineProcClient

        return EngineProcClient(config, eos_token_ids, connection=connection)
    if config.parallel.distributed_executor_backend == "ray":
        from raygrid.cluster.ray_engine import RayEngineClient

        return RayEngineClient(config, eos_token_ids, grammars)
    if separate_process:
        from raygrid.engine.core_proc import EngineProcClient

        return EngineProcClient(config, eos_token_ids, grammars=grammars)
    from raygrid.engine.core import EngineCore

    return EngineCore(config, eos_token_ids, grammars=grammars)
