"""RayExecutor: the workers of one replica as Ray actors, reached by collective RPC.

Each step's SchedulerOutput is put into the object store once and every worker reads the same
object. Only the output rank (first TP rank of the last pipeline stage) returns what the scheduler
needs, but every worker's result is awaited: a dead or failing worker fails the step at once
instead of leaving its peers waiting in a collective.
"""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raygrid.cluster.worker_actor import WorkerActor
from raygrid.config import EngineConfig
from raygrid.engine.executor import Executor, ReplicaLostError
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.placement.placement import WorkerSlot, uses_gpu

logger = logging.getLogger(__name__)


class WorkerFailedError(ReplicaLostError):
    """A worker of the replica died, raised or missed its deadline; the replica cannot continue."""


def gather(refs: list[ray.ObjectRef], what: str, timeout_s: float | None = None) -> list[Any]:
    """ray.get of all refs (one per rank), failing as soon as any one fails (a dead peer would otherwise
    leave the others blocked in a collective forever), or when ``timeout_s`` pass with no worker finishing
    (a hung one: its peers wait in a collective, so silence is what a hang looks like)."""
    results: dict[ray.ObjectRef, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not done:
            ranks = [i for i, ref in enumerate(refs) if ref not in results]
            raise WorkerFailedError(f"{what}: rank(s) {ranks} made no progress for {timeout_s:g} s (step_timeout_s); the replica is failed")
        for ref in done:
            try:
                results[ref] = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError, ray.exceptions.ObjectLostError) as error:
                raise WorkerFailedError(f"{what} failed on rank {refs.index(ref)}: {error}") from error
    return [results[ref] for ref in refs]


class RayExecutor(Executor):
    """The workers of one replica, in the placement ``slots`` its owner reserved (and will release)."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], slots: list[WorkerSlot], replica: int = 0) -> None:
        parallel = config.parallel
        self.grid = parallel.replica_grid()
        self.use_gpu = uses_gpu(config.device)
        self.step_timeout_s = parallel.step_timeout_s
        self.slots = slots
        self.names = [f"raygrid-{uuid.uuid4().hex[:8]}-replica{replica}-rank{slot.rank}" for slot in self.slots]
        self.workers = [
            WorkerActor.options(
                name=name,
                num_gpus=1 if self.use_gpu else 0,
                num_cpus=parallel.ray_worker_cpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(slot.placement_group, placement_group_bundle_index=slot.bundle_index),
            ).remote(config, eos_token_ids, slot.rank)
            for slot, name in zip(self.slots, self.names)
        ]
        ip, port = ray.get(self.workers[0].address.remote())
        gather([w.init_worker.remote(f"tcp://{ip}:{port}") for w in self.workers], "loading the model")
        self.output_rank = self.grid.rank_of(pp=self.grid.pp - 1, tp=0)
        # Threads that wait for the batches in flight (one per pipeline stage).
        self._waiters = ThreadPoolExecutor(max_workers=self.grid.pp, thread_name_prefix="raygrid-step")

    @property
    def max_concurrent_batches(self) -> int:
        # With pipeline stages, keep one batch in flight per stage so none of them idles.
        return self.grid.pp

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        refs = [w.execute_method.remote(method, *args, **(kwargs or {})) for w in self.workers]
        return gather(refs, method)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> Future:
        shared = ray.put(scheduler_output)  # once, read by every worker
        refs = [w.execute_model.remote(shared) for w in self.workers]
        return self._waiters.submit(lambda: gather(refs, "execute_model", self.step_timeout_s)[self.output_rank])

    def worker_names(self) -> list[str]:
        """Ray actor names of the workers, in rank order (``ray.get_actor(name)`` finds them)."""
        return list(self.names)

    def shutdown(self) -> None:
        """Kill the workers; the placement groups belong to whoever reserved them."""
        self._waiters.shutdown(wait=False, cancel_futures=True)
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # noqa: BLE001 - already gone
                pass

