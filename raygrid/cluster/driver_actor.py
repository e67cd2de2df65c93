"""DriverActor: one replica's engine core (scheduler + RayExecutor) as a Ray actor.

The front end talks to it once per step: ``step(new_requests, aborts)`` hands over what arrived,
runs one engine step (which broadcasts the SchedulerOutput to the replica's workers) and returns
the step's outputs. It also times itself, so the control overhead per step can be compared with
the time the workers spend in the model.
"""

from __future__ import annotations

import time

import ray

from raygrid.cluster.ray_executor import RayExecutor
from raygrid.config import EngineConfig
from raygrid.engine.core import EngineCore
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats


@ray.remote(num_cpus=0)
class DriverActor:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], replica: int) -> None:
        self.executor = RayExecutor(config, eos_token_ids, replica)
        self.core = EngineCore(config, eos_token_ids, executor=self.executor)
        self.step_seconds = 0.0

    def ready(self) -> bool:
        return True

    def step(self, new_requests: list[Request], aborts: list[str]) -> list[EngineCoreOutput]:
        for request in new_requests:
            self.core.add_request(request)
        if aborts:
            self.core.abort_requests(aborts)
        if not self.core.has_unfinished_requests():
            return []
        start = time.perf_counter()
        outputs = self.core.step()
        self.step_seconds += time.perf_counter() - start
        return outputs

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def step_timing(self) -> dict[str, float]:
        """Mean seconds per step as the driver sees it (scheduling, RPC, model) and as the output worker
        spent it (inputs, forward, sampling): the difference is the control overhead."""
        steps = max(self.core.num_steps, 1)
        return {
            "num_steps": self.core.num_steps,
            "driver_step_s": self.step_seconds / steps,
            "worker_execute_s": self.core.execute_seconds / steps,
            "max_batches_in_flight": self.core.max_batches_in_flight,
        }

    def worker_names(self) -> list[str]:
        return self.executor.worker_names()

    def reset_prefix_cache(self) -> bool:
        return self.core.reset_prefix_cache()

    def shutdown(self) -> None:
        self.core.shutdown()
