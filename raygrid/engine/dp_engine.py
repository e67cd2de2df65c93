"""DataParallelEngine: the DP ranks of one expert-parallel world, stepping together.

Under expert parallelism the DP replicas share their experts, so they are one world of workers and every
forward pass is a collective over all of them: each DP rank must run the same number of passes, a dummy
one when it has nothing to run. Each rank still has its own scheduler, KV pool and requests (an
``EngineCore``), and schedules on a thread of its own, so no rank waits for another's scheduling.

``StepLineup`` lines the ranks' steps up: a rank's k-th step joins the k-th steps of the others, and the
world step goes to the workers (one executor call carrying each DP rank's SchedulerOutput) once every rank
has given its k-th. A rank whose core gave nothing while another rank is ahead gives a dummy (None), so the
world never waits on an idle rank. Answers are read in world-step order by one thread at a time.

The world is the unit of failure: a step that fails on any rank leaves the others' collectives waiting,
so it fails the whole world (``ReplicaLostError``), which the front end treats as one replica.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable

from raygrid.config import EngineConfig
from raygrid.engine.core import EngineCore, initialize_kv_cache
from raygrid.engine.executor import Executor, ReplicaLostError
from raygrid.engine.outputs import EngineCoreOutput, ModelRunnerOutput, SchedulerOutput
from raygrid.engine.request import Request
from raygrid.engine.request_router import LeastLoadedRouter
from raygrid.engine.scheduler import SchedulerStats
from raygrid.engine.structured_output import GrammarCompiler

logger = logging.getLogger(__name__)

_MISSING = object()
_IDLE_WAIT_S = 0.05


class StepLineup:
    """Joins the DP ranks' k-th steps into world step k. ``executor.execute_model_async`` takes a list with
    each DP rank's SchedulerOutput (None: a dummy pass) and its result gives the list of their outputs."""

    def __init__(self, executor: Executor, dp: int, pipelined: bool) -> None:
        self.executor, self.dp, self.pipelined = executor, dp, pipelined
        self.cond = threading.Condition()
        self.counts = [0] * dp  # steps each rank has given
        self._slots: dict[int, list] = {}  # world step -> the ranks' SchedulerOutputs so far
        self._launched: dict[int, Any] = {}  # world step -> the executor's step in flight
        self._results: dict[int, list] = {}  # world step -> outputs not yet taken, per rank
        self._next_read = 0
        self._reading = False
        self._waiting = [False] * dp  # ranks blocked on a result, or idle until a peer gives a step
        self._failed: BaseException | None = None  # once a rank's step failed, no step of the world can finish

    def fail(self, error: BaseException) -> None:
        """The world is lost: every rank waiting on it, and every later call, gets ``error``."""
        with self.cond:
            self._failed = self._failed or error
            self.cond.notify_all()

    def check(self) -> None:
        if self._failed is not None:
            raise ReplicaLostError(f"another DP rank of the expert-parallel world failed: {self._failed}") from self._failed

    def submit(self, rank: int, scheduler_output: SchedulerOutput | None) -> "RankStep":
        with self.cond:
            self.check()
            step = self.counts[rank]
            self.counts[rank] += 1
            slot = self._slots.setdefault(step, [_MISSING] * self.dp)
            slot[rank] = scheduler_output
            if _MISSING not in slot:  # every rank has given its step: it goes to the workers
                del self._slots[step]
                self._launched[step] = (self.executor.execute_model_async(slot), slot)
            self.cond.notify_all()
        return RankStep(self, step, rank)

    def behind(self, rank: int) -> bool:
        """Whether another rank has given a step this one has not."""
        return max(self.counts) > self.counts[rank]

    def wait_for_peers(self, rank: int, timeout_s: float) -> None:
        """Sleep until another rank is ahead of this one (or the timeout)."""
        with self.cond:
            self._waiting[rank] = True  # it gives no step meanwhile: a reader need not wait for one
            self.cond.notify_all()
            try:
                self.cond.wait_for(lambda: self.behind(rank) or self._failed is not None, timeout=timeout_s)
            finally:
                self._waiting[rank] = False

    def result(self, step: int, rank: int) -> ModelRunnerOutput:
        with self.cond:
            self._waiting[rank] = True
            self.cond.notify_all()
            try:
                while step >= self._next_read:
                    self.check()
                    if self._reading or not self._may_read(step):
                        self.cond.wait(timeout=_IDLE_WAIT_S)
                        continue
                    self._read_next()
                return self._take(step, rank)
            finally:
                self._waiting[rank] = False

    def _may_read(self, step: int) -> bool:
        """World step ``step`` is out, and reading it now costs no overlap: without pipelining, always; with it (a
        worker answers a step when the next one arrives), once the next step is out too, or when every rank that
        has not given its next step is waiting itself, for a result or for work (then the answer is asked for on
        its own)."""
        if self._next_read not in self._launched:
            return False
        if not self.pipelined or self._next_read + 1 in self._launched:
            return True
        return all(self._waiting[r] or self.counts[r] > self._next_read + 1 for r in range(self.dp))

    def _read_next(self) -> None:
        """Read the oldest unread world step (with the lock released while the workers answer)."""
        step = self._next_read
        launched, slot = self._launched.pop(step)
        self._reading = True
        self.cond.release()
        try:
            outputs = list(launched.result())
        except BaseException as error:
            self.cond.acquire()
            self._reading = False
            self._failed = self._failed or error
            self.cond.notify_all()
            raise
        self.cond.acquire()
        self._reading = False
        for rank, scheduler_output in enumerate(slot):
            if scheduler_output is None:  # a dummy pass: nobody takes its output
                outputs[rank] = None
        if any(o is not None for o in outputs):
            self._results[step] = outputs
        self._next_read += 1
        self.cond.notify_all()

    def _take(self, step: int, rank: int) -> ModelRunnerOutput:
        outputs = self._results[step]
        output = outputs[rank]
        outputs[rank] = None
        if all(o is None for o in outputs):
            del self._results[step]
        return output


class RankStep:
    """One DP rank's step in flight: its output once the world step is answered."""

    def __init__(self, lineup: StepLineup, step: int, rank: int) -> None:
        self.lineup, self.step, self.rank = lineup, step, rank

    def result(self) -> ModelRunnerOutput:
        return self.lineup.result(self.step, self.rank)


class _RankExecutor(Executor):
    """One DP rank's view of the world's executor, for its EngineCore."""

    def __init__(self, lineup: StepLineup, rank: int, world: Executor) -> None:
        self.lineup, self.rank, self.world = lineup, rank, world

    @property
    def max_concurrent_batches(self) -> int:
        return self.world.max_concurrent_batches

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> RankStep:
        return self.lineup.submit(self.rank, scheduler_output)

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        if method == "reset_requests":  # a step of this rank failed: the world's collectives may be misaligned
            raise ReplicaLostError("a step failed under expert parallelism; the DP ranks' collectives cannot be trusted")
        return self.world.collective_rpc(method, args, kwargs)


class DataParallelEngine:
    """An EngineCore per DP rank over one world executor, each stepping on its own thread; the engine-core
    interface the driver uses (add_request, abort_requests, step, stats...) over all of them."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], executor: Executor,
                 grammars: GrammarCompiler | None = None) -> None:
        self.executor = executor
        dp = config.parallel.data_parallel_size
        num_blocks = initialize_kv_cache(executor, config)  # once for the world: its passes are collectives
        self.lineup = StepLineup(executor, dp, pipelined=bool(config.scheduler.async_scheduling))
        self.cores = [EngineCore(config, eos_token_ids, executor=_RankExecutor(self.lineup, d, executor), grammars=grammars,
                                 num_blocks=num_blocks) for d in range(dp)]
        self._inboxes: list[queue.SimpleQueue[Callable[[], None]]] = [queue.SimpleQueue() for _ in range(dp)]
        self._router = LeastLoadedRouter()  # unfinished request -> its DP rank
        self._outputs: list[EngineCoreOutput] = []
        self._ready = threading.Condition()
        self._error: BaseException | None = None
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, args=(d,), name=f"raygrid-dp{d}-steps", daemon=True) for d in range(dp)]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------------ the ranks' threads

    def _run(self, rank: int) -> None:
        core, lineup, inbox = self.cores[rank], self.lineup, self._inboxes[rank]
        try:
            while not self._stopping:
                lineup.check()
                while True:
                    try:
                        inbox.get_nowait()()
                    except queue.Empty:
                        break
                given = lineup.counts[rank]
                if core.has_unfinished_requests():
                    outputs = core.step()
                    if outputs:
                        with self._ready:
                            self._outputs.extend(outputs)
                            self._ready.notify_all()
                if lineup.behind(rank) and lineup.counts[rank] == given:
                    lineup.submit(rank, None)  # another rank ran a step this one had nothing for
                elif not core.has_unfinished_requests():
                    lineup.wait_for_peers(rank, _IDLE_WAIT_S)
        except BaseException as error:  # noqa: BLE001 - the world is lost: the driver's next step raises it
            if self._stopping:
                return
            logger.exception("DP rank %d stopped", rank)
            lineup.fail(error)
            with self._ready:
                self._error = error
                self._ready.notify_all()

    # ------------------------------------------------------------------ the engine-core interface

    def add_request(self, request: Request) -> None:
        rank = self._router.assign(request.request_id, range(len(self.cores)))
        self._inboxes[rank].put(lambda: self.cores[rank].add_request(request))

    def abort_requests(self, request_ids) -> None:
        by_rank: dict[int, list[str]] = {}
        for req_id in request_ids:
            rank = self._router.release(req_id)
            if rank is not None:
                by_rank.setdefault(rank, []).append(req_id)
        for rank, ids in by_rank.items():
            self._inboxes[rank].put(lambda rank=rank, ids=ids: self.cores[rank].abort_requests(ids))

    def has_unfinished_requests(self) -> bool:
        return bool(self._router)

    def step(self, wait_s: float = 0.05) -> list[EngineCoreOutput]:
        """The outputs the ranks produced since the last call (waiting up to ``wait_s`` for some)."""
        with self._ready:
            self._ready.wait_for(lambda: self._outputs or self._error is not None, timeout=wait_s)
            if self._error is not None:
                raise self._error
            outputs, self._outputs = self._outputs, []
        for out in outputs:
            if out.finished:
                self._router.release(out.req_id)
        return outputs

    @property
    def healthy(self) -> list[bool]:
        return [self._error is None]

    @property
    def lost(self) -> bool:
        return self._error is not None

    def stats(self) -> SchedulerStats:
        per_rank = [core.stats() for core in self.cores]
        stats = SchedulerStats.combined(per_rank)
        # One world rebalances once, and every rank hears of it: its figures are the world's, not a sum.
        latest = max(per_rank, key=lambda s: s.eplb_rebalances)
        stats.eplb_rebalances = latest.eplb_rebalances
        stats.expert_balancedness = latest.expert_balancedness
        stats.expert_balancedness_after_rebalance = latest.expert_balancedness_after_rebalance
        return stats

    def step_timing(self) -> list[dict[str, float]]:
        return [timing for core in self.cores for timing in core.step_timing()]

    def reset_prefix_cache(self) -> bool:
        """On each rank's thread, between its steps."""
        futures = []
        for core, inbox in zip(self.cores, self._inboxes):
            future: Future = Future()
            inbox.put(lambda core=core, future=future: future.set_result(core.reset_prefix_cache()))
            futures.append(future)
        return all(future.result(timeout=60) for future in futures)

    def shutdown(self) -> None:
        self._stopping = True
        self.lineup.fail(RuntimeError("the engine is shutting down"))  # wakes every rank waiting on the world
        for thread in self._threads:
            thread.join(timeout=30)
        for core in self.cores:
            core.shutdown()  # its executor is a view: the world's workers stay
        self.executor.shutdown()


def make_engine_core(config: EngineConfig, eos_token_ids: frozenset[int], executor: Executor,
                     grammars: GrammarCompiler | None = None):
    """The engine over a replica's workers: one EngineCore, or under expert parallelism with several DP ranks
    (one world) a DataParallelEngine of an engine core each. ``grammars``: the front end's compiler, pickled."""
    several = config.parallel.replica_grid().dp > 1
    return (DataParallelEngine if several else EngineCore)(config, eos_token_ids, executor=executor, grammars=grammars)
