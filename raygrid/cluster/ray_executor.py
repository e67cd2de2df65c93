"""RayExecutor: the workers of one replica as Ray actors.

Each step's SchedulerOutput reaches the workers one of two ways:
- a Ray Compiled Graph (the default on GPUs): one input node read by every worker's ``execute_model``,
  compiled once after start-up, so that each step moves over channels Ray set up ahead (shared memory
  between actors of a node) with no task submission or object-store round trip. Its readers wait by
  spinning, a core each, which a worker with a GPU and a core of its own can afford;
- ordinary actor calls (the default on CPU, where spinning readers would take the cores the model runs on):
  the SchedulerOutput is put into the object store once and every worker reads the same object.
Only the output rank (first TP rank of the last pipeline stage) returns what the scheduler needs, but every
worker's result is awaited: a dead or failing worker fails the step at once instead of leaving its peers
waiting in a collective, and a step that makes no progress for ``step_timeout_s`` fails the replica.
Other calls (loading, KV sizing, resets) go to every worker as ordinary actor calls: ``collective_rpc``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from typing import Any, Callable

import ray
from ray.dag import InputNode, MultiOutputNode
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raygrid.cluster.worker_actor import WorkerActor
from raygrid.config import EngineConfig
from raygrid.engine.executor import Executor, ReplicaLostError
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.placement.placement import WorkerSlot, check_checkpoint_readable, uses_gpu

logger = logging.getLogger(__name__)

_PING_TIMEOUT_S = 2.0  # a worker that cannot answer a ping this long after a missed deadline is the hung one


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
        check_checkpoint_readable(config.model.model, slots)  # a node that cannot is named, before anything loads
        self.names = [f"raygrid-{uuid.uuid4().hex[:8]}-replica{replica}-rank{slot.rank}" for slot in self.slots]
        self.workers = [
            WorkerActor.options(
                name=name,
                num_gpus=1 if self.use_gpu else 0,
                num_cpus=parallel.ray_worker_cpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(slot.placement_group, placement_group_bundle_index=slot.bundle_index),
                # Every GPU of the node stays visible, so NCCL can use NVLink between the replica's GPUs.
                runtime_env={"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}} if self.use_gpu else None,
            ).remote(config, eos_token_ids, slot.rank)
            for slot, name in zip(self.slots, self.names)
        ]
        ip, port = ray.get(self.workers[0].address.remote())
        gather([w.init_worker.remote(f"tcp://{ip}:{port}") for w in self.workers], "loading the model")
        # Each DP rank's output rank (first TP rank of its last pipeline stage); more than one when the DP
        # replicas are one world (expert parallelism), whose steps carry a SchedulerOutput per DP rank.
        self.output_ranks = [self.grid.rank_of(dp=d, pp=self.grid.pp - 1, tp=0) for d in range(self.grid.dp)]
        self.async_scheduling = bool(config.scheduler.async_scheduling)
        self._actor_ranks = {w._actor_id.hex(): rank for rank, w in enumerate(self.workers)}
        self._pid_ranks = {pid: rank for rank, pid in enumerate(ray.get([w.pid.remote() for w in self.workers]))}
        # With async scheduling the workers pipeline their steps (Worker.execute_model_pipelined): each send
        # launches its step and answers the step launched before it. ``_sends`` holds, in order, each send's
        # waiter and the step it answers (None: nothing); ``_pending_step`` is the step launched and not yet answered.
        self._method = "execute_model_pipelined" if self.async_scheduling else "execute_model"
        self._sends: deque[tuple[Callable[[], list], int | None]] = deque()
        self._lock = threading.Lock()  # sends may come from one thread while another reads (DataParallelEngine)
        self._pending_step: int | None = None
        self._num_steps = 0
        self._dag = None
        # The default needs GPUs and one node: across nodes Ray 2.60's compiled-graph channels can crash a
        # raylet ("experimental_mutable_object_provider.cc:154 ... Channel closed", ray-project/ray#63229; seen
        # here in tests/test_multinode.py), so a replica spread over nodes takes actor calls unless told otherwise.
        nodes = set(ray.get([w.node_id.remote() for w in self.workers])) | {ray.get_runtime_context().get_node_id()}
        compiled = parallel.compiled_graph if parallel.compiled_graph is not None else (self.use_gpu and len(nodes) == 1)
        if compiled and len(nodes) > 1:
            logger.warning("compiled_graph=True across %d nodes: Ray's cross-node channels can crash a raylet (ray#63229)", len(nodes))
        self.transport = "compiled graph" if compiled else "actor calls"
        if compiled:
            with InputNode() as scheduler_output:
                dag = MultiOutputNode([getattr(w, self._method).bind(scheduler_output) for w in self.workers])
            # One more than the steps in flight: a flush may follow them.
            self._dag = dag.experimental_compile(_submit_timeout=self.step_timeout_s, _max_inflight_executions=self.max_concurrent_batches + 1)

    @property
    def max_concurrent_batches(self) -> int:
        # Pipeline stages keep one batch in flight each so none of them idles; async scheduling sends the next
        # step while one runs (the workers launch it before answering the one before, and take the tokens it
        # needs from that step's samples on the device).
        return 2 if self.async_scheduling else self.grid.pp

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        refs = [w.execute_method.remote(method, *args, **(kwargs or {})) for w in self.workers]
        return gather(refs, method)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.execute_model_async(scheduler_output).result()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> "_StepInFlight":
        if not self.async_scheduling:
            wait = self._send(scheduler_output)
            return _StepInFlight(lambda: self._output(wait()))
        with self._lock:
            step, self._num_steps = self._num_steps, self._num_steps + 1
            self._sends.append((self._send(scheduler_output), self._pending_step))
            self._pending_step = step
        return _StepInFlight(lambda: self._pipelined_output(step))

    def _pipelined_output(self, step: int) -> ModelRunnerOutput:
        """The answers are read by one thread at a time, in order; sends may come meanwhile."""
        with self._lock:
            if self._pending_step == step:  # nothing was sent after it: ask for it alone
                self._sends.append((self._send(None), step))
                self._pending_step = None
        while self._sends:
            wait, answers = self._sends.popleft()
            outputs = wait()
            if answers == step:
                return self._output(outputs)
            # an answer to nothing, or to a step the engine dropped (it recovered from an error): read and let go
        raise RuntimeError(f"step {step} was never sent")  # the engine asks for its steps in order; not reached

    def _send(self, scheduler_output: SchedulerOutput | None) -> Callable[[], list]:
        """Send a step to every worker; returns a waiter for their answers, in rank order."""
        if self._dag is None:
            shared = ray.put(scheduler_output)  # once, read by every worker
            refs = [getattr(w, self._method).remote(shared) for w in self.workers]
            return lambda: gather(refs, "execute_model", self.step_timeout_s)
        try:
            ref = self._dag.execute(scheduler_output)
        except ray.exceptions.RayError as error:
            raise self._failure(error) from error

        def wait() -> list:
            try:
                return ray.get(ref, timeout=self.step_timeout_s)
            except ray.exceptions.RayError as error:
                raise self._failure(error) from error
        return wait

    def _output(self, outputs: list[ModelRunnerOutput]):
        """The output rank's result, timed as the slowest worker's (what the step waited for); under expert
        parallelism the list of each DP rank's."""
        slowest = max(o.execute_seconds for o in outputs)
        for rank in self.output_ranks:
            outputs[rank].execute_seconds = slowest
        if len(self.output_ranks) == 1:
            return outputs[self.output_ranks[0]]
        return [outputs[rank] for rank in self.output_ranks]

    def _failure(self, error: Exception) -> WorkerFailedError:
        """The replica-failing error for what a step raised, naming the rank when it can be told."""
        if isinstance(error, ray.exceptions.RayChannelTimeoutError):
            pings = [w.pid.remote() for w in self.workers]
            ready, _ = ray.wait(pings, num_returns=len(pings), timeout=_PING_TIMEOUT_S)
            ranks = [rank for rank, ping in enumerate(pings) if ping not in ready]
            return WorkerFailedError(f"execute_model: rank(s) {ranks} made no progress for {self.step_timeout_s:g} s "
                                     f"(step_timeout_s); the replica is failed")
        rank = None
        if isinstance(error, ray.exceptions.RayTaskError):
            rank = self._pid_ranks.get(error.pid)
        elif isinstance(error, ray.exceptions.ActorDiedError) and error.actor_id:
            rank = self._actor_ranks.get(error.actor_id)
        where = f" on rank {rank}" if rank is not None else ""
        return WorkerFailedError(f"execute_model failed{where}: {error}")

    def check_workers(self, timeout_s: float = _PING_TIMEOUT_S) -> None:
        """Raise WorkerFailedError if a worker is dead or cannot answer within ``timeout_s`` (between steps)."""
        gather([w.pid.remote() for w in self.workers], "ping", timeout_s)

    def worker_pids(self) -> list[int]:
        """The workers' process ids, in rank order."""
        return sorted(self._pid_ranks, key=self._pid_ranks.get)

    def worker_names(self) -> list[str]:
        """Ray actor names of the workers, in rank order (``ray.get_actor(name)`` finds them)."""
        return list(self.names)

    def shutdown(self) -> None:
        """Tear the compiled graph down and kill the workers; the placement groups belong to whoever reserved them."""
        dag, self._dag = getattr(self, "_dag", None), None
        if dag is not None:
            try:
                dag.teardown(kill_actors=True)
            except Exception:  # noqa: BLE001 - a dead worker fails the teardown's cancellation; they are killed below
                pass
        for worker in self.workers:
            try:
                ray.kill(worker)
            except Exception:  # noqa: BLE001 - already gone
                pass



class _StepInFlight:
    """A step sent to the workers; ``result()`` waits for every worker and returns the output rank's."""

    def __init__(self, wait: Callable[[], ModelRunnerOutput]) -> None:
        self.result = wait
