"""RayEngineClient: the front end's handle on one or more engine replicas running on Ray.

Each data-parallel replica (under expert parallelism: the one world of all DP ranks, which steps and fails
as one) is a DriverActor with its own workers (TP x PP) in placement groups that this
client reserves and therefore releases: on shutdown, when the client is garbage-collected or the
interpreter exits, and when the replica fails. New requests go to the serving replica with the fewest
unfinished requests. Replicas step independently, each on its own loop: the front end keeps at most one
exchange call in flight per replica, carrying the requests and aborts that arrived since the last one and
bringing back the outputs the replica produced meanwhile, and ``step()`` returns the outputs of whichever
replicas answer first, so a slow or hung replica never delays the others.

A replica whose worker dies or hangs (its driver's step deadline), or whose driver stops answering, leaves
rotation at once and is rebuilt in the background: its actors and placement groups are released, new ones
reserved, and the replica serves again once its new driver answers (a start that fails is tried again, at
growing intervals). Its unfinished requests migrate (engine/migration.py): each continues on a serving
replica from the tokens already returned, up to ``max_migrations`` times; requests wait for a serving replica
(a rebuild) for up to ``migration_timeout_s``, and past either limit fail with an error that says which.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from dataclasses import dataclass

import ray

from raygrid.cluster.driver_actor import DriverActor
from raygrid.config import EngineConfig
from raygrid.engine.migration import RequestLedger, past_limit
from raygrid.engine.outputs import EngineCoreOutput
from raygrid.engine.request import Request
from raygrid.engine.request_router import LeastLoadedRouter
from raygrid.engine.scheduler import SchedulerStats
from raygrid.engine.structured_output import GrammarCompiler
from raygrid.placement.placement import (WorkerSlot, check_cluster_fits, ensure_ray, place_replica, release, reserve_replica,
                                         uses_gpu)

logger = logging.getLogger(__name__)

_RESTART_BACKOFF_S = (1.0, 60.0)  # wait before starting a failed rebuild again: first, and at most (doubling between)


class _Replica:
    """One replica's actors and reservations, where it stands, and what the front end queued for its next step.

    States: "starting" (its driver is loading, on a rebuild thread after a failure), "serving", "failed"
    (released). The front end's thread reads the state and steps a serving replica; a rebuild thread
    changes a starting one, under ``lock``."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.state = "failed"
        self.lock = threading.Lock()
        self.driver = None
        self.slots: list[WorkerSlot] = []
        self.rebuild: threading.Thread | None = None
        self.num_rebuilds = 0
        self.adds: list[Request] = []
        self.aborts: list[str] = []
        self.step_ref: ray.ObjectRef | None = None
        self.step_started = 0.0
        self.stats = SchedulerStats()  # as of its last step

    @property
    def serving(self) -> bool:
        return self.state == "serving"

    def start(self, config: EngineConfig, eos_token_ids: frozenset[int], slots: list[WorkerSlot],
              grammars: ray.ObjectRef | None) -> ray.ObjectRef:
        """Start a driver (and so its workers) in ``slots``; returns what answers once it has loaded."""
        self.slots, self.state = slots, "starting"
        self.driver = DriverActor.remote(config, eos_token_ids, self.index, slots, grammars)
        return self.driver.stats.remote()

    def release(self) -> None:
        """Kill the driver (its workers die with it, as it owns them) and free the placement groups."""
        self.state = "failed"
        self.step_ref = None
        self.adds, self.aborts = [], []
        if self.driver is not None:
            try:
                ray.kill(self.driver)
            except Exception:  # noqa: BLE001 - already gone, or Ray already shut down
                pass
        self.driver = None
        release(self.slots)
        self.slots = []


def _rebuild(replica: _Replica, config: EngineConfig, eos_token_ids: frozenset[int], grammars: ray.ObjectRef | None,
             stop: threading.Event) -> None:
    """A rebuild thread: new placement groups and a new driver for a failed replica, tried again at growing
    intervals until one starts (or the client shuts down). Holds no reference to the client."""
    parallel, began = config.parallel, time.monotonic()
    for attempt in itertools.count():
        with replica.lock:
            if stop.is_set():
                return
            slots = reserve_replica(parallel.replica_grid(), uses_gpu(config.device), parallel.ray_worker_cpus)
            ready = replica.start(config, eos_token_ids, slots, grammars)
        while not stop.is_set() and not ray.wait([ready], timeout=0.5)[0]:
            pass
        with replica.lock:
            if stop.is_set():
                return  # the client's release takes what was started
            try:
                replica.stats = ray.get(ready)
            except ray.exceptions.RayError as error:
                wait = min(_RESTART_BACKOFF_S[0] * 2**attempt, _RESTART_BACKOFF_S[1])
                logger.error("engine replica %d did not start (%s); trying again in %g s", replica.index,
                             str(error).strip().splitlines()[-1][:300], wait)
                replica.release()
            else:
                replica.num_rebuilds += 1
                replica.state = "serving"
                logger.warning("engine replica %d is back in service, %.1f s after it failed", replica.index,
                               time.monotonic() - began)
                return
        stop.wait(wait)


def _release_all(replicas: list[_Replica], stop: threading.Event) -> None:
    stop.set()
    if not ray.is_initialized():
        return  # the cluster went first, and everything with it
    for replica in replicas:
        with replica.lock:
            replica.release()


@dataclass
class _Waiting:
    """A request no replica holds: new while none served, or migrating from a failed one."""

    request: Request
    deadline: float
    cause: str | None = None  # the failure it migrates from (None: a new request)
    counted: bool = False  # its move was counted and logged when it was first placed (it never reached that replica)


class RayEngineClient:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], grammars: GrammarCompiler | None = None) -> None:
        """``grammars``: the front end's compiler; each driver gets a copy with its tokenizer, so that it needs
        neither transformers nor torch (it starts seconds sooner)."""
        ensure_ray(config.parallel.ray_address)
        self.config, self.eos_token_ids = config, eos_token_ids
        parallel = config.parallel
        # The driver enforces step_timeout_s on its workers; this catches a driver that hangs itself.
        self.driver_timeout_s = 2 * parallel.step_timeout_s
        self.migration_timeout_s = parallel.migration_timeout_s
        grid, use_gpu = parallel.replica_grid(), uses_gpu(config.device)
        # Fail before starting anything if the cluster cannot hold every replica.
        check_cluster_fits(grid, use_gpu, parallel.ray_worker_cpus, parallel.num_engine_replicas)
        self.replicas = [_Replica(i) for i in range(parallel.num_engine_replicas)]
        self._stop = threading.Event()  # ends the rebuild threads
        # Releases everything however this client ends: shutdown(), garbage collection, interpreter exit.
        self._finalizer = weakref.finalize(self, _release_all, self.replicas, self._stop)
        # One copy in the object store for every driver, rebuilt ones included.
        self._grammars = ray.put(grammars) if grammars is not None else None
        try:
            ready = [r.start(config, eos_token_ids, place_replica(grid, use_gpu, parallel.ray_worker_cpus), self._grammars)
                     for r in self.replicas]
            for replica, stats in zip(self.replicas, ray.get(ready)):
                replica.state, replica.stats = "serving", stats
        except BaseException:
            self.shutdown()
            raise
        self._router = LeastLoadedRouter()  # unfinished request id -> its replica's index
        self._ledger = RequestLedger(parallel.max_migrations)  # what came back of each, to migrate it
        self._waiting: dict[str, _Waiting] = {}
        self.num_migrations = 0
        self._retired = SchedulerStats()  # the counters of replicas that failed, which keep counting in the totals

    @property
    def healthy(self) -> list[bool]:
        """Per replica: in service now (a replica being rebuilt is not)."""
        return [r.serving for r in self.replicas]

    @property
    def lost(self) -> bool:
        return False  # a failed replica is rebuilt

    def add_request(self, request: Request) -> None:
        self._ledger.add(request)
        serving = [r.index for r in self.replicas if r.serving]
        if serving:
            self.replicas[self._router.assign(request.request_id, serving)].adds.append(request)
        else:  # every replica is being rebuilt: it waits for the first back
            self._waiting[request.request_id] = _Waiting(request, time.monotonic() + self.migration_timeout_s)

    def abort_requests(self, request_ids) -> None:
        for req_id in request_ids:
            self._ledger.forget(req_id)
            self._waiting.pop(req_id, None)
            index = self._router.release(req_id)
            if index is not None:
                self.replicas[index].aborts.append(req_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._router) or bool(self._waiting)

    def step(self) -> list[EngineCoreOutput]:
        """Start a step on every idle replica that has work, then return what the first replicas to
        answer produced (waiting at most a moment, so that new requests reach idle replicas soon). Waiting
        requests go to serving replicas first."""
        outputs = self._place_waiting()
        for replica in self.replicas:
            if replica.serving and replica.step_ref is None and (self._router.load(replica.index) or replica.adds or replica.aborts):
                replica.step_ref = replica.driver.exchange.remote(replica.adds, replica.aborts)
                replica.step_started = time.monotonic()
                replica.adds, replica.aborts = [], []
        in_flight = {r.step_ref: r for r in self.replicas if r.step_ref is not None}
        if not in_flight:
            if self._waiting:
                time.sleep(0.05)  # for a rebuild
            return outputs
        done, _ = ray.wait(list(in_flight), num_returns=1, timeout=0.1)
        if done:  # take every other answer that is already there too
            done, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
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
            self._ledger.record(replica_outputs)
            outputs.extend(replica_outputs)
        return outputs

    # ------------------------------------------------------------------ failure, migration, rebuild

    def _fail_replica(self, replica: _Replica, error: Exception) -> list[EngineCoreOutput]:
        """Take the replica out of rotation, release it and rebuild it on a thread; its requests migrate, or
        fail past their limit."""
        error = getattr(error, "cause", None) or error  # what the driver raised, not Ray's wrapping of it
        cause = str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
        failure = f"engine replica {replica.index} failed: {cause}"
        logger.error("%s; rebuilding it", failure)
        unsent = {r.request_id: r for r in replica.adds}  # never reached it: they simply go elsewhere
        held = self._router.release_all(replica.index)
        self._retired.add_counters(replica.stats)
        replica.stats = SchedulerStats()  # its successor counts from zero
        replica.release()
        replica.state = "starting"
        replica.rebuild = threading.Thread(target=_rebuild, args=(replica, self.config, self.eos_token_ids, self._grammars, self._stop),
                                           name=f"raygrid-rebuild-replica{replica.index}", daemon=True)
        replica.rebuild.start()
        deadline = time.monotonic() + self.migration_timeout_s
        outputs = []
        for rid in held:
            if rid in unsent:  # it goes elsewhere as it came: a move it was making still is the one move
                self._waiting[rid] = _Waiting(unsent[rid], deadline, cause=self._ledger.cause(rid), counted=True)
                continue
            resumed = self._ledger.migrate(rid, failure)
            if resumed is not None:
                self._waiting[rid] = _Waiting(resumed, deadline, cause=failure)
            else:
                error = past_limit(failure, self._ledger.max_migrations)
                outputs.append(EngineCoreOutput(rid, [], [], finish_reason="abort", error=error))
        return outputs

    def _place_waiting(self) -> list[EngineCoreOutput]:
        """Hand waiting requests to serving replicas; fail those that waited past migration_timeout_s."""
        if not self._waiting:
            return []
        serving = [r.index for r in self.replicas if r.serving]
        now, outputs = time.monotonic(), []
        for rid, waiting in list(self._waiting.items()):
            if serving:
                index = self._router.assign(rid, serving)
                self.replicas[index].adds.append(waiting.request)
                if waiting.cause is not None and not waiting.counted:
                    self.num_migrations += 1
                    logger.warning("request %s migrates to engine replica %d with %d token(s) made (move %d of at most "
                                   "%d) after: %s", rid, index, waiting.request.num_output_tokens,
                                   self._ledger.migrations(rid), self._ledger.max_migrations, waiting.cause)
            elif now > waiting.deadline:
                self._ledger.forget(rid)
                after = f" after: {waiting.cause}" if waiting.cause else ""
                outputs.append(EngineCoreOutput(rid, [], [], finish_reason="abort", error=(
                    f"no engine replica could take the request within migration_timeout_s={self.migration_timeout_s:g} s{after}")))
            else:
                continue
            del self._waiting[rid]
        return outputs

    def stats(self) -> SchedulerStats:
        """The serving replicas' gauges and counters as of their last steps, summed (KV usage averaged), the
        counters with those of the replicas that failed before, and this front end's migrations and rebuilds;
        no round trip."""
        stats = SchedulerStats.combined([r.stats for r in self.replicas if r.serving])
        stats.add_counters(self._retired)
        stats.request_migrations, stats.replica_rebuilds = self.num_migrations, sum(r.num_rebuilds for r in self.replicas)
        return stats

    def step_timing(self) -> list[dict[str, float]]:
        """Per replica, in index order; zeros for one out of service (a rebuilt replica counts from zero)."""
        answers = dict(self._live_calls(lambda d: d.step_timing.remote()))
        idle = {"num_steps": 0, "engine_step_s": 0.0, "worker_execute_s": 0.0, "max_batches_in_flight": 0}
        return [answers.get(r.index, idle) for r in self.replicas]

    def collective_rpc(self, method: str, args: tuple = ()) -> list[list]:
        """Per serving replica, ``method`` on each of its workers, in rank order (run between steps)."""
        return [results for _, results in self._live_calls(lambda d: d.collective_rpc.remote(method, args))]

    def transports(self) -> list[str]:
        """Per serving replica: how its steps reach its workers ("compiled graph" or "actor calls")."""
        return [t for _, t in self._live_calls(lambda d: d.transport.remote())]

    def worker_names(self, replica: int = 0) -> list[str]:
        return ray.get(self.replicas[replica].driver.worker_names.remote())

    def reset_prefix_cache(self) -> bool:
        return all(ok for _, ok in self._live_calls(lambda d: d.reset_prefix_cache.remote()))

    def _live_calls(self, call) -> list[tuple[int, object]]:
        """(index, answer) of each serving replica that answers ``call(driver)``. One whose call fails, or does
        not answer within the driver deadline, is left out: it failed since its last exchange, and its next
        exchange takes it out of service."""
        live = [(r.index, call(r.driver)) for r in self.replicas if r.serving]
        answers = []
        for index, ref in live:
            try:
                answers.append((index, ray.get(ref, timeout=self.driver_timeout_s)))
            except ray.exceptions.RayError as error:
                logger.warning("engine replica %d did not answer: %s", index, str(error).strip().splitlines()[0][:200])
        return answers

    def shutdown(self) -> None:
        """Stop the workers and rebuilds, and free every placement group; safe to call more than once."""
        self._stop.set()
        for replica in self.replicas:
            if replica.rebuild is not None:
                replica.rebuild.join(timeout=5)
        for replica in self.replicas:
            if replica.serving:
                try:
                    ray.get(replica.driver.shutdown.remote(), timeout=30)
                except Exception:  # noqa: BLE001 - a dead or hung driver is killed below anyway
                    pass
        self._finalizer()
