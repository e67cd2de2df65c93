"""DriverActor: one replica's engine core (scheduler + RayExecutor) as a Ray actor.

The front end talks to it once per step: ``step(new_requests, aborts)`` hands over what arrived,
runs one engine step (which broadcasts the SchedulerOutput to the replica's workers) and returns
the step's outputs and the scheduler's counters. ``step_timing`` compares the engine's time per step with the workers' own.
"""

from __future__ import annotations

import ray

from raygrid.cluster.ray_executor import RayExecutor
from raygrid.config import EngineConfig
from raygrid.engine.core import EngineCore
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats
from raygrid.placement.placement import WorkerSlot


@ray.remote(num_cpus=0)
class DriverActor:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], replica: int, slots: list[WorkerSlot]) -> None:
        self.executor = RayExecutor(config, eos_token_ids, slots, replica)
        self.core = EngineCore(config, eos_token_ids, executor=self.executor)

    def step(self, new_requests: list[Request], aborts: list[str]) -> tuple[list[EngineCoreOutput], SchedulerStats]:
        """One engine step; its outputs come back with the scheduler's counters as they are after it,
        so the front end never has to ask a replica that is busy stepping."""
        for request in new_requests:
            self.core.add_request(request)
        if aborts:
            self.core.abort_requests(aborts)
        outputs = self.core.step() if self.core.has_unfinished_requests() else []
        return outputs, self.core.stats()

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def step_timing(self) -> dict[str, float]:
        return self.core.step_timing()[0]

    def worker_names(self) -> list[str]:
        return self.executor.worker_names()

    def reset_prefix_cache(self) -> bool:
        return self.core.reset_prefix_cache()

    def shutdown(self) -> None:
        self.core.shutdown()
