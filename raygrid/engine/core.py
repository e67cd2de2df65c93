"""EngineCore: the step loop of one replica. schedule -> executor.execute_model -> update_from_output."""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections import deque
from concurrent.futures import Future
from pathlib import Path

from raygrid.config import EngineConfig
from raygrid.engine.executor import Executor, InProcessExecutor, ReplicaLostError
from raygrid.engine.gc_tuning import hold_serving_collector, release_serving_collector
from raygrid.engine.outputs import EngineCoreOutput, SchedulerOutput
from raygrid.engine.request import Request
from raygrid.engine.scheduler import Scheduler, SchedulerStats
from raygrid.engine.structured_output import GrammarCompiler

logger = logging.getLogger(__name__)

# How long a step with nothing to run but requests whose grammars are compiling waits for the first of them; the
# loop's caller gets control back after it (new requests, aborts) either way.
GRAMMAR_WAIT_S = 0.01


def checkpoint_vocab_size(model_dir: str) -> int:
    """The checkpoint's vocabulary size, read from its config.json. transformers' AutoConfig gives the same field,
    but importing it (and torch with it) would add about 2 s to a Ray driver's start, which needs neither."""
    fields = json.loads((Path(model_dir) / "config.json").read_text())
    if isinstance(fields.get("vocab_size"), int):
        return fields["vocab_size"]
    from raygrid.models.loader import load_hf_config  # a config that leaves it to the architecture's default

    return load_hf_config(model_dir).vocab_size


def initialize_kv_cache(executor: Executor, config: EngineConfig) -> int:
    """Size the KV pool (the smallest any worker can hold, unless fixed), make it on every worker, and return
    its number of blocks."""
    num_blocks = config.cache.num_kv_blocks or min(executor.collective_rpc("determine_num_kv_blocks"))
    block_size, max_len = config.cache.block_size, config.model.max_model_len
    needed = -(-max_len // block_size) + 1
    if num_blocks < needed:
        fits = max(num_blocks - 1, 0) * block_size  # the longest request the pool holds (one block is the null block)
        remedy = ("raise gpu_memory_utilization or num_kv_blocks" if config.on_gpu()
                  else f"raise num_kv_blocks (on a CPU the pool is {config.cache.cpu_kv_cache_space_gib:g} GiB unless set)")
        raise ValueError(
            f"the KV pool has {num_blocks} blocks of {block_size} tokens; one request of max_model_len "
            f"({max_len}) needs {needed} (with the null block): "
            + (f"lower max_model_len to at most {fits}, or {remedy}" if fits else remedy)
        )
    executor.collective_rpc("initialize_cache", (num_blocks,))
    return num_blocks


class EngineCore:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], executor: Executor | None = None,
                 grammars: GrammarCompiler | None = None, num_blocks: int | None = None) -> None:
        """``grammars``: the input processor's compiler, when it lives in this process (one tokenizer to build, and
        each grammar compiled once: the processor's check leaves it in the cache) or was pickled from it (a Ray
        driver: llguidance's tokenizer without transformers). ``num_blocks``: the KV pool the
        workers already hold (several engine cores sharing one world's workers); by default it is sized and made here."""
        self.config = config
        self.executor = executor or InProcessExecutor(config, eos_token_ids)
        if num_blocks is None:
            num_blocks = initialize_kv_cache(self.executor, config)
        # Pipeline stages split the requests over their batches; async scheduling (one device) does not.
        split = 1 if config.scheduler.async_scheduling else self.executor.max_concurrent_batches
        self.grammars = grammars or GrammarCompiler(config.model.tokenizer or config.model.model,
                                                    checkpoint_vocab_size(config.model.model), eos_token_ids)
        self.scheduler = Scheduler(config, num_blocks, num_batches_in_flight=split, grammars=self.grammars,
                                   grammar_waits_for_token=not self.executor.defers_grammar_sampling,
                                   pin_grammar_masks=self.executor.copies_from_host_memory)
        self._in_flight: deque[tuple[SchedulerOutput, Future]] = deque()
        self.num_steps = 0
        self.step_seconds = 0.0  # wall time inside step(): scheduling, execution (or waiting for it), updates
        self.max_batches_in_flight = 0
        self.eplb_reports: list = []  # the EPLB rebalances (parallel/eplb.py's RebalanceReport), oldest first
        self.execute_seconds = 0.0  # worker-side time of those steps: taking the step to its tokens on the host (slowest rank)
        # Benchmarks set this to a list to get (finish time, scheduled tokens, scheduled requests) per step.
        self.step_trace: list[tuple[float, int, int]] | None = None
        block_size = config.cache.block_size
        logger.info("KV cache: %d blocks of %d tokens (%d tokens)", num_blocks, block_size, (num_blocks - 1) * block_size)
        # What startup made (imports, the model, the KV block pool) lives as long as the engine: frozen out of the
        # cyclic collector's sight, and full collections deferred (engine/gc_tuning.py; the H200 runs saw 0.3 s
        # pauses of the step loop). shutdown(), or this engine's collection, undoes it.
        hold_serving_collector()
        self._release_collector = weakref.finalize(self, release_serving_collector)

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids) -> None:
        self.scheduler.abort_requests(request_ids)

    def step(self) -> list[EngineCoreOutput]:
        start = time.perf_counter()
        try:
            outputs = self._step()
        except ReplicaLostError:
            raise
        except Exception as error:  # noqa: BLE001 - whatever it was, the engine must keep serving
            outputs = self._recover(error)
        self.step_seconds += time.perf_counter() - start
        return outputs

    def _recover(self, error: Exception) -> list[EngineCoreOutput]:
        """A step raised (bad input that validation missed, a bug): no single request can be blamed, so
        the requests in flight fail with the error, the workers forget every request, and the engine is
        back in a clean state; waiting requests are untouched and will run."""
        logger.exception("engine step failed; failing the %d running request(s)", len(self.scheduler.running))
        self._in_flight.clear()
        message = f"the engine step failed ({type(error).__name__}: {error}); the engine carries on without this request"
        failed = self.scheduler.fail_running(message)
        self.executor.collective_rpc("reset_requests")
        return failed

    def _step(self) -> list[EngineCoreOutput]:
        """Schedule and run one batch, and return what finished computing.

        With pipeline stages several batches are kept in flight: while the queue has room and the
        scheduler finds work (requests whose last step is still in flight have nothing to schedule),
        another batch is started; then the oldest one is awaited. Under async scheduling a request with a
        grammar needs its newest token for its next mask: in one process a step launches its forward pass
        and holds its sampling; once the step before's tokens have advanced the grammars its mask starts
        filling, and its sampling is launched just before the next step's forward pass (or when it is
        awaited). Elsewhere the step in flight is awaited first."""
        failed = self.scheduler.take_failed()
        if failed:
            return failed
        waits = self._in_flight and self.scheduler.waits_for_tokens_in_flight()
        if len(self._in_flight) < self.executor.max_concurrent_batches and not waits:
            scheduler_output = self.scheduler.schedule()
            if not scheduler_output.is_empty or scheduler_output.finished_req_ids:
                for _, earlier in self._in_flight:  # its forward pass needs their tokens
                    self.executor.sample_deferred(earlier)
                launched = self.executor.execute_model_async(scheduler_output)
                if not self._in_flight:  # no step before it: the grammars are current, it can sample now
                    self.executor.sample_deferred(launched)
                self._in_flight.append((scheduler_output, launched))
                self.max_batches_in_flight = max(self.max_batches_in_flight, len(self._in_flight))
                if len(self._in_flight) < self.executor.max_concurrent_batches and not scheduler_output.is_empty:
                    return []
        if not self._in_flight:
            self.scheduler.wait_for_grammars(GRAMMAR_WAIT_S)
            return []
        scheduler_output, future = self._in_flight.popleft()
        runner_output = future.result()
        if self.step_trace is not None:
            self.step_trace.append((time.perf_counter(), scheduler_output.total_num_scheduled_tokens, len(scheduler_output.num_scheduled_tokens)))
        self.num_steps += 1
        self.execute_seconds += runner_output.execute_seconds
        if runner_output.eplb is not None:
            self.eplb_reports.append(runner_output.eplb)
        return self.scheduler.update_from_output(scheduler_output, runner_output, grammars_advanced=self._start_grammar_fills)

    def _start_grammar_fills(self) -> None:
        """The grammars have seen the awaited step's tokens: the masks of the steps after it can fill."""
        for later, _ in self._in_flight:
            later.start_grammar_fill()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._in_flight)

    @property
    def healthy(self) -> list[bool]:
        return [True]  # a step that fails is recovered from; one that cannot be is raised

    @property
    def lost(self) -> bool:
        return False

    def step_timing(self) -> list[dict[str, float]]:
        """Per replica (one here): mean seconds per step as the engine sees it, and from a worker taking the
        step to its sampled tokens being on the host (inputs, forward, sampling, copy back; the slowest
        rank's). On Ray, where each worker runs its steps one after another, the difference is the control
        overhead: scheduling, the hops to the workers and back, and the output update."""
        steps = max(self.num_steps, 1)
        return [{
            "num_steps": self.num_steps,
            "engine_step_s": self.step_seconds / steps,
            "worker_execute_s": self.execute_seconds / steps,
            "max_batches_in_flight": self.max_batches_in_flight,
        }]

    def stats(self) -> SchedulerStats:
        stats = self.scheduler.stats()
        if self.eplb_reports:
            last = self.eplb_reports[-1]
            stats.eplb_rebalances = len(self.eplb_reports)
            stats.expert_balancedness = last.balancedness_before
            stats.expert_balancedness_after_rebalance = last.balancedness_after
        return stats

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv.reset_prefix_cache()

    def shutdown(self) -> None:
        self.grammars.shutdown()
        self.scheduler.shutdown()
        self._release_collector()  # before the executor's release, whose collection must see the model
        self.executor.shutdown()
