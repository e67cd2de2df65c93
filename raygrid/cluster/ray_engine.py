"""RayEngineClient: the front end's handle on one or more engine replicas running on Ray.

Each data-parallel replica (under expert parallelism: the one world of all DP ranks, which steps and fails
as one) is a DriverActor with its own workers (TP x PP) in placement groups that this
client reserves and therefore releases: on shutdown, when the client is garbage-collected or the
interpreter exits, and when the replica fails. New requests go to the replica with the fewest unfinished
requests. Replicas step independently, each on its own loop: the front end keeps at most one exchange
call in flight per replica, carrying the requests and aborts that arrived since the last one and bringing
back the outputs the replica produced meanwhile, and ``step()`` returns the outputs of whichever replicas
answer first, so a slow or hung replica never delays the others. A replica whose worker dies or hangs
(its driver's step deadline) fails its in-flight requests with an error and is taken out of rotation.
"""

from __future__ import annotations

import logging
import time
import weakref

import ray

from raygrid.cluster.driver_actor import DriverActor
from raygrid.config import EngineConfig
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.request_router import LeastLoadedRouter
from raygrid.engine.scheduler import SchedulerStats
from raygrid.placement.placement import WorkerSlot, check_cluster_fits, place_replica, release, uses_gpu

logger = logging.getLogger(__name__)


def ensure_ray(address: str | None) -> None:
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)


class _Replica:
    """One replica's actors and reservations, and what the front end queued for its next step."""

    def __init__(self, driver, slots: list[WorkerSlot]) -> None:
        self.driver, self.slots = driver, slots
        self.healthy = True
        self.adds: list[Request] = []
        self.aborts: list[str] = []
        self.step_ref: ray.ObjectRef | None = None
        self.step_started = 0.0
        self.stats = SchedulerStats()  # as of its last step

    def release(self) -> None:
        """Kill the driver (its workers die with it, as it owns them) and free the placement groups."""
        self.healthy = False
        try:
            ray.kill(self.driver)
        except Exception:  # noqa: BLE001 - already gone, or Ray already shut down
            pass
        release(self.slots)


def _release_all(replicas: list[_Replica]) -> None:
    if not ray.is_initialized():
        return  # the cluster went first, and everything with it
    for replica in replicas:
        replica.release()


class RayEngineClient:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int]) -> None:
        ensure_ray(config.parallel.ray_address)
        parallel = config.parallel
        # The driver enforces step_timeout_s on its workers; this catches a driver that hangs itself.
        self.driver_timeout_s = 2 * parallel.step_timeout_s
        grid, use_gpu = parallel.replica_grid(), uses_gpu(config.device)
        # Fail before starting anything if the cluster cannot hold every replica.
        check_cluster_fits(grid, use_gpu, parallel.ray_worker_cpus, parallel.num_engine_replicas)
        self.replicas: list[_Replica] = []
        # Releases everything however this client ends: shutdown(), garbage collection, interpreter exit.
        self._finalizer = weakref.finalize(self, _release_all, self.replicas)
        try:
            for i in range(parallel.num_engine_replicas):
                slots = place_replica(grid, use_gpu, parallel.ray_worker_cpus)
                self.replicas.append(_Replica(DriverActor.remote(config, eos_token_ids, i, slots), slots))
            for replica, stats in zip(self.replicas, ray.get([r.driver.stats.remote() for r in self.replicas])):
                replica.stats = stats  # answered once the driver (and so its workers) are up
        except BaseException:
            self.shutdown()
            raise
        self._router = LeastLoadedRouter()  # unfinished request id -> its replica's index

    @property
    def healthy(self) -> list[bool]:
        return [r.healthy for r in self.replicas]

    def add_request(self, request: Request) -> None:
        candidates = [i for i, r in enumerate(self.replicas) if r.healthy]
        if not candidates:
            raise RuntimeError("no healthy engine replica is left")
        self.replicas[self._router.assign(request.request_id, candidates)].adds.append(request)

    def abort_requests(self, request_ids) -> None:
        for req_id in request_ids:
            index = self._router.release(req_id)
            if index is not None:
                self.replicas[index].aborts.append(req_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._router)

    def step(self) -> list[EngineCoreOutput]:
        """Start a step on every idle replica that has work, then return what the first replicas to
        answer produced (waiting at most a moment, so that new requests reach idle replicas soon)."""
        for index, replica in enumerate(self.replicas):
            if replica.healthy and replica.step_ref is None and (self._router.load(index) or replica.adds or replica.aborts):
                replica.step_ref = replica.driver.exchange.remote(replica.adds, replica.aborts)
                replica.step_started = time.monotonic()
                replica.adds, replica.aborts = [], []
        in_flight = {r.step_ref: r for r in self.replicas if r.step_ref is not None}
        if not in_flight:
            return []
        done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.1)
        if done:  # take every other answer that is already there too
            done, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
        outputs: list[EngineCoreOutput] = []
        now = time.monotonic()
        for replica in in_flight.values():
            if replica.step_ref not in done and now - replica.step_started > self.driver_timeout_s:
                error = TimeoutError(f"its driver did not answer for {self.driver_timeout_s:g} s (2 x step_timeout_s)")
                outputs.extend(self._fail_replica(replica, error))
        for ref in done:
            replica = in_flight[ref]
            replica.step_ref = None
            try:
                replica_outputs, replica.stats = ray.get(ref)
            except ray.exceptions.RayError as error:
                outputs.extend(self._fail_replica(replica, error))
                continue
            for out in replica_outputs:
                if out.finished:
                    self._router.release(out.req_id)
            outputs.extend(replica_outputs)
        return outputs

    def _fail_replica(self, replica: _Replica, error: Exception) -> list[EngineCoreOutput]:
        index = self.replicas.index(replica)
        logger.error("engine replica %d failed: %s", index, error)
        error = getattr(error, "cause", None) or error  # what the driver raised, not Ray's wrapping of it
        cause = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        message = f"engine replica {index} failed and is out of service: {cause}"
        failed = self._router.release_all(index)
        replica.step_ref = None
        replica.release()
        return [EngineCoreOutput(rid, [], [], finish_reason="abort", error=message) for rid in failed]

    def stats(self) -> SchedulerStats:
        """The healthy replicas' counters as of their last steps, summed (KV usage averaged); no round trip."""
        return SchedulerStats.combined([r.stats for r in self.replicas if r.healthy])

    def step_timing(self) -> list[dict[str, float]]:
        return [timing for _, timing in self._live_calls(lambda d: d.step_timing.remote())]

    def collective_rpc(self, method: str, args: tuple = ()) -> list[list]:
        """Per healthy replica, ``method`` on each of its workers, in rank order (run between steps)."""
        return [results for _, results in self._live_calls(lambda d: d.collective_rpc.remote(method, args))]

    def transports(self) -> list[str]:
        """Per healthy replica: how its steps reach its workers ("compiled graph" or "actor calls")."""
        return [t for _, t in self._live_calls(lambda d: d.transport.remote())]

    def worker_names(self, replica: int = 0) -> list[str]:
        return ray.get(self.replicas[replica].driver.worker_names.remote())

    def reset_prefix_cache(self) -> bool:
        return all(ok for _, ok in self._live_calls(lambda d: d.reset_prefix_cache.remote()))

    def _live_calls(self, call):
        live = [r for r in self.replicas if r.healthy]
        return zip(live, ray.get([call(r.driver) for r in live]))

    def shutdown(self) -> None:
        """Stop the workers and free every placement group; safe to call more than once."""
        for replica in self.replicas:
            if replica.healthy:
                try:
                    ray.get(replica.driver.shutdown.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead or hung driver is killed below anyway
                    pass
        self._finalizer()
