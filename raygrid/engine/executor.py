"""Executors run a method on every worker of a replica: ``collective_rpc(method, args)``.

The scheduler never sees workers; it hands the executor a SchedulerOutput and gets the driver
rank's ModelRunnerOutput back, so an in-process executor and a Ray one are interchangeable.
"""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from concurrent.futures import Future
from typing import Any

from raygrid.config import EngineConfig
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput


class ReplicaLostError(RuntimeError):
    """A worker of the replica died, hung past its deadline or left its collectives in an unknown state:
    the replica cannot continue (an engine core does not try to recover from this)."""


class Executor(ABC):
    @abstractmethod
    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        """Call ``method`` on every worker, in rank order; returns each worker's result."""

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,))[0]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Future:
        """Start a step; the result comes through the Future. Here: run it now."""
        future: Future = Future()
        try:
            future.set_result(self.execute_model(scheduler_output))
        except BaseException as error:
            future.set_exception(error)
        return future

    @property
    def max_concurrent_batches(self) -> int:
        """Steps the engine may keep in flight at once (more than one with pipeline stages)."""
        return 1

    @property
    def defers_grammar_sampling(self) -> bool:
        """Whether a step in flight can hold its sampling until ``sample_deferred`` (then, under async
        scheduling, a request with a grammar is scheduled while its newest token is still being sampled)."""
        return False

    def sample_deferred(self, future) -> None:
        """Launch the sampling a step in flight deferred (see ``defers_grammar_sampling``)."""

    @property
    def copies_from_host_memory(self) -> bool:
        """Whether a GPU in this process reads the scheduler's host arrays (grammar masks) directly, so that
        pinning them pays. Elsewhere they are pickled, and pinning would only open a CUDA context here."""
        return False

    def shutdown(self) -> None:  # noqa: B027 - most executors hold nothing to release
        """Release the workers; by default there is nothing to release."""


class InProcessExecutor(Executor):
    """One worker in this process: one GPU, or the CPU."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int]) -> None:
        from raygrid.engine.worker import Worker  # here, not above: a Ray driver imports this module, not the model

        self.worker = Worker(config, eos_token_ids)
        self.async_scheduling = config.scheduler.async_scheduling

    @property
    def max_concurrent_batches(self) -> int:
        # Async scheduling: the next step is scheduled and launched while this one runs on the GPU.
        return 2 if self.async_scheduling else 1

    @property
    def defers_grammar_sampling(self) -> bool:
        return self.async_scheduling

    def execute_model_async(self, scheduler_output: SchedulerOutput):
        return self.worker.execute_model(scheduler_output, non_blocking=True, defer_grammar=self.async_scheduling)

    def sample_deferred(self, future) -> None:
        future.sample_now()

    @property
    def copies_from_host_memory(self) -> bool:
        return self.worker.device.type == "cuda"

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    def shutdown(self) -> None:
        """Drop the model and KV cache now, so another engine in this process can have the device."""
        self.worker = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
