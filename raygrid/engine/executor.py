"""Executors run a method on every worker of a replica: ``collective_rpc(method, args)``.

The scheduler never sees workers; it hands the executor a SchedulerOutput and gets the driver
rank's ModelRunnerOutput back, so an in-process executor and a Ray one are interchangeable.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from raygrid.config import EngineConfig
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.engine.worker import Worker


class Executor(ABC):
    @abstractmethod
    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Call ``method`` on every worker, in rank order; returns each worker's result."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,))[0]

    def shutdown(self) -> None:
        pass


class InProcessExecutor(Executor):
    """One worker in this process: one GPU, or the CPU."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int]) -> None:
        self.worker = Worker(config, eos_token_ids)

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]
