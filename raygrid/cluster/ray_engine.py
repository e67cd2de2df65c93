"""RayEngineClient: the front end's handle on one or more engine replicas running on Ray.

Each data-parallel replica is a DriverActor with its own workers (TP x PP). New requests go to the
replica with the fewest unfinished requests; each step calls every busy replica once, in parallel,
carrying the requests and aborts that arrived since. A replica whose worker dies fails its in-flight
requests with an error and is taken out of rotation; the others keep serving.
"""

from __future__ import annotations

import logging

import ray

from raygrid.cluster.driver_actor import DriverActor
from raygrid.config import EngineConfig
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import SchedulerStats
from raygrid.placement.placement import check_cluster_fits, uses_gpu

logger = logging.getLogger(__name__)


def ensure_ray(address: str | None) -> None:
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)


class RayEngineClient:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int]) -> None:
        ensure_ray(config.parallel.ray_address)
        parallel = config.parallel
        num_replicas = parallel.data_parallel_size
        # Fail before starting anything if the cluster cannot hold every replica.
        check_cluster_fits(parallel.replica_grid(), uses_gpu(config.device), parallel.ray_worker_cpus, num_replicas)
        self.drivers = [DriverActor.remote(config, eos_token_ids, i) for i in range(num_replicas)]
        try:
            ray.get([d.ready.remote() for d in self.drivers])
        except ray.exceptions.RayError:
            self.shutdown()
            raise
        self.healthy = [True] * num_replicas
        self._adds: list[list[Request]] = [[] for _ in range(num_replicas)]
        self._aborts: list[list[str]] = [[] for _ in range(num_replicas)]
        self._owner: dict[str, int] = {}  # unfinished request id -> replica
        self._load = [0] * num_replicas

    def add_request(self, request: Request) -> None:
        candidates = [i for i, ok in enumerate(self.healthy) if ok]
        if not candidates:
            raise RuntimeError("no healthy engine replica is left")
        replica = min(candidates, key=lambda i: self._load[i])
        self._adds[replica].append(request)
        self._owner[request.request_id] = replica
        self._load[replica] += 1

    def abort_requests(self, request_ids) -> None:
        for req_id in request_ids:
            replica = self._owner.pop(req_id, None)
            if replica is not None:
                self._aborts[replica].append(req_id)
                self._load[replica] -= 1

    def has_unfinished_requests(self) -> bool:
        return bool(self._owner)

    def step(self) -> list[EngineCoreOutput]:
        calls = {}
        for i, driver in enumerate(self.drivers):
            if self.healthy[i] and (self._load[i] or self._adds[i] or self._aborts[i]):
                calls[i] = driver.step.remote(self._adds[i], self._aborts[i])
                self._adds[i], self._aborts[i] = [], []
        outputs: list[EngineCoreOutput] = []
        for i, ref in calls.items():
            try:
                replica_outputs = ray.get(ref)
            except ray.exceptions.RayError as error:
                outputs.extend(self._fail_replica(i, error))
                continue
            for out in replica_outputs:
                if out.finished and self._owner.pop(out.req_id, None) is not None:
                    self._load[i] -= 1
            outputs.extend(replica_outputs)
        return outputs

    def _fail_replica(self, replica: int, error: Exception) -> list[EngineCoreOutput]:
        logger.error("engine replica %d failed: %s", replica, error)
        self.healthy[replica] = False
        message = f"engine replica {replica} failed ({type(error).__name__}): a worker died or raised; the replica is out of service"
        failed = [rid for rid, owner in self._owner.items() if owner == replica]
        for rid in failed:
            del self._owner[rid]
        self._load[replica] = 0
        try:
            ray.kill(self.drivers[replica])
        except Exception:
            pass
        return [EngineCoreOutput(rid, [], [], finish_reason="abort", error=message) for rid in failed]

    def stats(self) -> SchedulerStats:
        total = SchedulerStats()
        for _, stats in self._live_calls(lambda d: d.stats.remote()):
            for field in vars(total):
                setattr(total, field, getattr(total, field) + getattr(stats, field))
        live = sum(self.healthy) or 1
        total.kv_cache_usage /= live
        return total

    def step_timing(self) -> list[dict[str, float]]:
        return [timing for _, timing in self._live_calls(lambda d: d.step_timing.remote())]

    def worker_names(self, replica: int = 0) -> list[str]:
        return ray.get(self.drivers[replica].worker_names.remote())

    def reset_prefix_cache(self) -> bool:
        return all(ok for _, ok in self._live_calls(lambda d: d.reset_prefix_cache.remote()))

    def _live_calls(self, call):
        live = [i for i, ok in enumerate(self.healthy) if ok]
        return zip(live, ray.get([call(self.drivers[i]) for i in live]))

    def shutdown(self) -> None:
        for driver in self.drivers:
            try:
                ray.get(driver.shutdown.remote(), timeout=30)
            except Exception:
                pass
            try:
                ray.kill(driver)
            except Exception:
                pass
