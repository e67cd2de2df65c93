"""The continuous-batching scheduler.

There are no prefill and decode phases: each step hands out a token budget so that every request's
``num_computed_tokens`` catches up with its ``num_tokens``. Running requests are served first, then
waiting ones (with their prefix-cache hits). A prompt larger than the remaining budget is chunked.
When the KV pool runs dry a running request is preempted: its blocks are freed and it will be
recomputed from scratch, which the prefix cache makes cheap.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from functools import partial

from raygrid.config import EngineConfig
from raygrid.engine import token_bans
from raygrid.engine.kv_cache import KVCacheBlock, KVCacheManager
from raygrid.engine.outputs import (
    CachedRequestData,
    EngineCoreOutput,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from raygrid.engine.request import Request, RequestStatus
from raygrid.engine.structured_output import GrammarCompiler, GrammarThread, GrammarVerdict, grammar_error_line


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_preemptions: int = 0  # since start
    num_scheduled_tokens: int = 0  # tokens computed since start
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache since start
    prefix_cache_hits: int = 0
    # Expert parallelism with EPLB: rebalances since start, and the balancedness (mean over max tokens per EP
    # rank, 1.0 is even) the last one measured over its window, and expects of its new placement.
    eplb_rebalances: int = 0
    expert_balancedness: float = 0.0
    expert_balancedness_after_rebalance: float = 0.0
    # A front end's over several replicas (cluster/ray_engine.py, serve/engine_client.py): requests moved to
    # another replica after theirs failed, and failed replicas started again and back in service.
    request_migrations: int = 0
    replica_rebuilds: int = 0

    # The fields that only grow (the others are gauges: values now).
    COUNTERS = ("num_preemptions", "num_scheduled_tokens", "prefix_cache_queries", "prefix_cache_hits", "eplb_rebalances",
                "request_migrations", "replica_rebuilds")

    def add_counters(self, other: "SchedulerStats") -> None:
        """Add ``other``'s counters to this one's (a replica that left service keeps its share of the totals)."""
        for name in self.COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    @classmethod
    def combined(cls, replicas: list["SchedulerStats"]) -> "SchedulerStats":
        """Several replicas' counters as one: summed, the KV usage and balancedness averaged."""
        total = cls()
        for stats in replicas:
            for name in vars(total):
                setattr(total, name, getattr(total, name) + getattr(stats, name))
        for name in ("kv_cache_usage", "expert_balancedness", "expert_balancedness_after_rebalance"):
            setattr(total, name, getattr(total, name) / (len(replicas) or 1))
        return total


class WaitingQueue:
    """Requests waiting to run, best first: by arrival (FCFS) or by (priority, arrival)."""

    def __init__(self, policy: str) -> None:
        self._by_priority = policy == "priority"
        self._heap: list[tuple] = []
        self._counter = itertools.count()

    def _key(self, req: Request) -> tuple:
        if self._by_priority:
            return (req.priority, req.arrival_time, next(self._counter))
        return (req.arrival_time, next(self._counter))

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (*self._key(req), req))

    def peek(self) -> Request:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def remove(self, req: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[-1] is not req]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (entry[-1] for entry in self._heap)


class Scheduler:
    def __init__(self, config: EngineConfig, num_kv_blocks: int, num_batches_in_flight: int = 1,
                 grammars: GrammarCompiler | None = None, grammar_waits_for_token: bool = True,
                 pin_grammar_masks: bool = False) -> None:
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_num_batched_tokens = config.scheduler.max_num_batched_tokens
        self.max_model_len = config.model.max_model_len
        self.chunked_prefill = config.scheduler.enable_chunked_prefill
        self.long_prefill_threshold = config.scheduler.long_prefill_token_threshold
        self.policy = config.scheduler.policy
        # With pipeline stages several batches run at once; each takes a share of the requests so
        # that every stage has work.
        self.num_batches_in_flight = num_batches_in_flight
        self.async_scheduling = bool(config.scheduler.async_scheduling)
        cache = config.cache
        self.kv = KVCacheManager(num_kv_blocks, cache.block_size, cache.enable_prefix_caching, cache.prefix_caching_hash_seed)

        self.requests: dict[str, Request] = {}
        self.waiting = WaitingQueue(self.policy)
        self.running: list[Request] = []
        # Structured outputs: requests whose grammar is compiling (they join `waiting` when it is ready),
        # the live requests that have a grammar, and the outputs of those whose grammar failed to compile.
        self.grammars = grammars
        # Async scheduling: whether a request with a grammar waits for its token in flight before its next step
        # (False where the executor holds a step's sampling until the grammars have seen the step before's tokens).
        self.grammar_waits_for_token = grammar_waits_for_token
        self.pin_grammar_masks = pin_grammar_masks  # a GPU in this process copies them (see GrammarThread)
        self._grammar_work: GrammarThread | None = None  # advances the matchers and fills the masks, in order
        self._verdicts_in_flight: Future | None = None  # see update_from_output
        self.compiling: list[Request] = []
        self._structured: dict[str, Request] = {}
        self._failed: list[EngineCoreOutput] = []
        # Finished since the last schedule(): the workers are told so they can drop their state.
        # In the order they finished (a dict as an ordered set): see SchedulerOutput.finished_req_ids.
        self._finished_for_workers: dict[str, None] = {}
        # Per step in flight: the incarnation (num_preemptions) of each scheduled request that has been
        # preempted before. An output whose request has been preempted since is stale and dropped.
        self._step_counter = itertools.count()
        self._incarnations: dict[int, dict[str, int]] = {}
        self._num_preemptions = 0
        self._num_scheduled_tokens = 0
        self._prefix_queries = 0
        self._prefix_hits = 0

    # ---------------------------------------------------------------- requests in and out

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in the engine")
        if request.is_structured and self.grammars is None:
            raise ValueError("structured_outputs: this engine has no grammar compiler")
        self.requests[request.request_id] = request
        if request.is_structured:  # it waits in `compiling` until its grammar is ready
            request.grammar_future = self.grammars.submit(request.sampling_params.structured_outputs)
            self._structured[request.request_id] = request
            self.compiling.append(request)
        else:
            self.waiting.push(request)

    def abort_requests(self, request_ids) -> list[Request]:
        aborted = []
        for req_id in request_ids:
            req = self.requests.get(req_id)
            if req is None or req.is_finished:
                continue
            self._remove(req)
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            aborted.append(req)
        return aborted

    def _remove(self, req: Request) -> None:
        """Take an unfinished request off whichever queue holds it."""
        if req.status == RequestStatus.RUNNING:
            self.running.remove(req)
        elif req in self.compiling:
            self.compiling.remove(req)
        else:
            self.waiting.remove(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.compiling) or bool(self._failed)

    def wait_for_grammars(self, timeout_s: float) -> None:
        """Block up to ``timeout_s`` for the first grammar to compile when nothing else is left to run. A loop
        that stepped meanwhile would only spin, and on the GIL it shares with the compile thread it slowed that
        compile (and a first grammar's tokenizer load) several times over."""
        if self.compiling and not self.running and not self.waiting and not self._failed:
            wait([r.grammar_future for r in self.compiling], timeout=timeout_s, return_when=FIRST_COMPLETED)

    def _admit_compiled(self) -> None:
        """Requests whose grammar has compiled join the waiting queue; those whose grammar failed finish
        with the error (the input processor checks grammars first, so this is rare)."""
        for req in [r for r in self.compiling if r.grammar_future.done()]:
            self.compiling.remove(req)
            error = req.grammar_future.exception()
            if error is not None:
                self._finish(req, RequestStatus.FINISHED_ABORTED)
                self._failed.append(EngineCoreOutput(req.request_id, [], [], finish_reason="abort", error=str(error), invalid=True))
                continue
            req.grammar = req.grammar_future.result()
            if req.output_token_ids and not req.grammar.consume_tokens(req.output_token_ids):
                # A migrated request (engine/migration.py): its grammar catches up with the tokens made elsewhere.
                error = f"its earlier output broke its grammar: {grammar_error_line(req.grammar.get_error())}"
                self._finish(req, RequestStatus.FINISHED_ABORTED)
                self._failed.append(EngineCoreOutput(req.request_id, [], [], finish_reason="abort", error=error))
                continue
            self.waiting.push(req)

    def take_failed(self) -> list[EngineCoreOutput]:
        """Outputs of requests that failed outside a step (a grammar that did not compile)."""
        failed, self._failed = self._failed, []
        return failed

    def waits_for_tokens_in_flight(self) -> bool:
        """Async scheduling: a request with a grammar whose newest token is still being sampled cannot be
        scheduled (its mask depends on that token); the engine should finish the step in flight first."""
        return self.grammar_waits_for_token and any(r.grammar is not None and r.num_output_placeholders
                                                    for r in self._structured.values())

    def fail_running(self, message: str) -> list[EngineCoreOutput]:
        """After a failed step: finish every running request with ``message`` as its error, and assume the
        workers forgot every request (waiting ones are sent in full again). The steps in flight may not
        have written their KV, so the prefix cache starts over."""
        outputs = []
        for req in list(self.running):
            self.running.remove(req)
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            outputs.append(EngineCoreOutput(req.request_id, [], [], finish_reason="abort", error=message))
        self._finished_for_workers.clear()
        self._incarnations.clear()
        for req in self.waiting:
            req.num_tokens_sent = 0
            req.num_output_placeholders = 0
        self.kv.reset_prefix_cache()
        return outputs

    # ---------------------------------------------------------------- one step's plan

    def schedule(self) -> SchedulerOutput:
        if self.compiling:
            self._admit_compiled()
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled: list[Request] = []
        resumed: set[str] = set()
        preempted_any = False
        max_requests = -(-(len(self.running) + len(self.waiting)) // self.num_batches_in_flight)

        i = 0
        while i < len(self.running) and budget > 0 and len(scheduled) < max_requests:
            req = self.running[i]
            num_new = self._num_tokens_to_schedule(req, req.num_computed_tokens, budget)
            if num_new == 0:
                i += 1
                continue
            new_blocks = self.kv.allocate_slots(req, num_new)
            while new_blocks is None:
                victim = self._pick_victim()
                victim_index = self.running.index(victim)
                if victim.request_id in num_scheduled:  # give back what it was granted this step
                    budget += num_scheduled.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    scheduled.remove(victim)
                self._preempt(victim)
                preempted_any = True
                if victim is req:
                    break
                if victim_index < i:
                    i -= 1
                new_blocks = self.kv.allocate_slots(req, num_new)
            if new_blocks is None:
                continue  # req itself was preempted; self.running[i] is now the next request
            num_scheduled[req.request_id] = num_new
            new_block_ids[req.request_id] = [b.block_id for b in new_blocks]
            scheduled.append(req)
            budget -= num_new
            i += 1

        # No new admissions in a step that had to preempt: the pool is already short.
        while (not preempted_any and len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs
               and len(scheduled) < max_requests):
            req = self.waiting.peek()
            hits: list[KVCacheBlock] = []
            num_hit_tokens = 0
            if req.num_computed_tokens == 0 and req.sampling_params.prompt_logprobs is None:
                # (A request that wants its prompt's logprobs computes the whole prompt: a hit has no logits.)
                hits, num_hit_tokens = self.kv.get_computed_blocks(req)
            num_new = self._num_tokens_to_schedule(req, num_hit_tokens, budget)
            if num_new == 0:
                break  # without chunked prefill the prompt must wait for a step with room for all of it
            new_blocks = self.kv.allocate_slots(req, num_new, hits)
            if new_blocks is None:
                break
            self.waiting.pop()
            if req.status == RequestStatus.PREEMPTED:
                resumed.add(req.request_id)
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit_tokens
                req.first_scheduled_time = time.monotonic()
            self._prefix_queries += req.num_tokens
            self._prefix_hits += num_hit_tokens
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_hit_tokens
            self.running.append(req)
            num_scheduled[req.request_id] = num_new
            new_block_ids[req.request_id] = self.kv.block_ids(req.request_id)
            scheduled.append(req)
            budget -= num_new

        return self._build_output(scheduled, num_scheduled, new_block_ids, resumed)

    def _num_tokens_to_schedule(self, req: Request, num_computed: int, budget: int) -> int:
        pending = req.num_output_placeholders
        if pending and (req.num_output_tokens + pending >= req.max_tokens or req.num_tokens + pending >= self.max_model_len):
            return 0  # the token in flight is its last one
        if pending and req.grammar is not None and self.grammar_waits_for_token:
            return 0  # its grammar mask needs the token in flight
        num_new = req.num_tokens + pending - num_computed
        if self.long_prefill_threshold:
            num_new = min(num_new, self.long_prefill_threshold)
        if num_new > budget and not self.chunked_prefill and req.num_computed_tokens == 0:
            return 0
        return min(num_new, budget)

    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: Request) -> None:
        """Free the request's blocks and queue it for recompute. Its tokens past ``num_computed_tokens``
        were granted in this very step (if at all), which is now withdrawn: their blocks leave the cache.
        Outputs of its steps still in flight belong to the old incarnation and will be dropped."""
        self.running.remove(req)
        self.kv.free(req, num_written_tokens=req.num_computed_tokens)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_output_placeholders = 0
        req.num_preemptions += 1
        self._num_preemptions += 1
        self.waiting.push(req)

    def _build_output(
        self,
        scheduled: list[Request],
        num_scheduled: dict[str, int],
        new_block_ids: dict[str, list[int]],
        resumed: set[str],
    ) -> SchedulerOutput:
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        for req in scheduled:
            rid = req.request_id
            if req.num_tokens_sent == 0:
                new_reqs.append(
                    NewRequestData(
                        req_id=rid,
                        token_ids=list(req.all_token_ids),
                        num_prompt_tokens=req.num_prompt_tokens,
                        sampling_params=req.sampling_params,
                        block_ids=new_block_ids[rid],
                        num_computed_tokens=req.num_computed_tokens,
                    )
                )
            else:
                cached.req_ids.append(rid)
                # A request readmitted after preemption gets its whole block table again.
                cached.resumed_from_preemption.append(rid in resumed)
                cached.new_token_ids.append(req.all_token_ids[req.num_tokens_sent :])
                cached.new_block_ids.append(new_block_ids[rid])
                cached.num_computed_tokens.append(req.num_computed_tokens)
            req.num_tokens_sent = req.num_tokens
        total = sum(num_scheduled.values())
        for req in scheduled:  # the plan is fixed: count its tokens as computed
            req.num_computed_tokens += num_scheduled[req.request_id]
            if self.async_scheduling and req.num_computed_tokens == req.num_tokens + req.num_output_placeholders:
                req.num_output_placeholders += 1  # it samples this step
        self._num_scheduled_tokens += total
        grammar_reqs = [r for r in scheduled if r.grammar is not None and r.num_computed_tokens >= r.num_tokens]  # they sample
        finished, self._finished_for_workers = list(self._finished_for_workers), {}
        step_id = next(self._step_counter)
        incarnations = {r.request_id: r.num_preemptions for r in scheduled if r.num_preemptions}
        if incarnations:
            self._incarnations[step_id] = incarnations
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=total,
            finished_req_ids=finished,
            step_id=step_id,
            grammar_req_ids=[r.request_id for r in grammar_reqs],
            fill_grammar_bitmask=self._grammar_bitmask(grammar_reqs) if grammar_reqs else None,
        )

    def _grammar_bitmask(self, reqs: list[Request]):
        """What starts filling the step's mask, once the matchers have seen every token before this step's
        (they advance in update_from_output; under async scheduling in one process the engine starts the fill
        after the step before has been through it, and the worker's sampling waits for the fill)."""
        return partial(self._grammar_thread().fill, [r.grammar for r in reqs])

    def _grammar_thread(self) -> GrammarThread:
        if self._grammar_work is None:
            self._grammar_work = GrammarThread(self.grammars.vocab_size, self.max_num_seqs, pinned=self.pin_grammar_masks)
        return self._grammar_work

    def shutdown(self) -> None:
        if self._grammar_work is not None:
            self._grammar_work.shutdown()

    # ---------------------------------------------------------------- results back

    def update_from_output(self, sched_out: SchedulerOutput, runner_out: ModelRunnerOutput,
                           grammars_advanced: Callable[[], None] | None = None) -> list[EngineCoreOutput]:
        """Take a step's sampled tokens.

        Structured outputs: the tokens go to the grammars on the grammar thread, and ``grammars_advanced`` is
        called at once (the engine queues the next step's mask behind them). Where the engine schedules a
        request again before its newest token is seen (async scheduling in one process), the grammars' verdicts
        (a grammar completed, or refused a token) come with the next update: such a request finishes then,
        with no new tokens, and the token its extra step sampled is dropped. Elsewhere they are awaited here."""
        outputs = self._apply_grammar_verdicts(self._verdicts_in_flight) if self._verdicts_in_flight else []
        self._verdicts_in_flight = None
        incarnations = self._incarnations.pop(sched_out.step_id, {})
        verdicts = self._advance_grammars(runner_out, incarnations)
        if grammars_advanced is not None:
            grammars_advanced()
        if verdicts is not None and not self.grammar_waits_for_token:
            self._verdicts_in_flight, verdicts = verdicts, None
        verdicts = verdicts.result() if verdicts is not None else {}
        for req_id, reason in runner_out.errors.items():
            req = self._scheduled_incarnation(req_id, incarnations)
            if req is None:
                continue
            self.running.remove(req)
            self._finish(req, RequestStatus.FINISHED_ABORTED)
            outputs.append(EngineCoreOutput(req_id, [], [], finish_reason="abort", error=f"the engine could not take this request ({reason})"))
        for req_id, token_ids, logprobs in zip(runner_out.req_ids, runner_out.sampled_token_ids, runner_out.logprobs):
            req = self._scheduled_incarnation(req_id, incarnations)
            if req is None:
                continue
            prompt_logprobs = self._new_prompt_logprobs(req, runner_out.prompt_logprobs.get(req_id))
            if not token_ids:
                if prompt_logprobs:  # a prompt chunk of a request that wants its prompt's logprobs
                    outputs.append(EngineCoreOutput(req_id, [], [], num_cached_tokens=max(req.num_cached_tokens, 0),
                                                    new_prompt_logprobs=prompt_logprobs))
                continue  # only part of the prompt was computed
            new_tokens: list[int] = []
            status = None
            req.num_output_placeholders = max(req.num_output_placeholders - len(token_ids), 0)
            error = None
            verdict = verdicts.get(req_id)
            for i, token_id in enumerate(token_ids):
                req.append_output_token(token_id)
                new_tokens.append(token_id)
                status, error, invalid = (self._grammar_status(req, verdict) if verdict is not None and verdict.index == i
                                          else (None, None, False))
                if status is None and req.bans_tokens and token_bans.breaks_bans(req, token_id):
                    status, error, invalid = RequestStatus.FINISHED_ABORTED, token_bans.no_token_left(req, req.grammar is not None), True
                status = status or self._check_stop(req, token_id)
                if status is not None and req.grammar is not None and self._verdicts_in_flight is not None:
                    # It ends here anyway (length, EOS, a stop token): its grammar's verdict on this token comes
                    # first, as where verdicts are awaited (a grammar completed on its last allowed token is "stop").
                    late = self._verdicts_in_flight.result().get(req_id)
                    if late is not None and late.index == i:
                        status, error, invalid = self._grammar_status(req, late)
                if status is not None:
                    break
            out = EngineCoreOutput(
                req_id=req_id,
                new_token_ids=new_tokens,
                new_logprobs=[logprobs] if logprobs is not None else [],
                num_cached_tokens=max(req.num_cached_tokens, 0),
                new_prompt_logprobs=prompt_logprobs,
            )
            if req.num_output_tokens == len(new_tokens) and req.first_scheduled_time is not None:
                out.queue_time = req.first_scheduled_time - req.arrival_time
            if status is not None:
                self.running.remove(req)  # still the incarnation that was scheduled, so still running
                self._finish(req, status)
                out.finish_reason, out.stop_reason, out.error, out.invalid = status.finish_reason, req.stop_reason, error, invalid
            outputs.append(out)
        return outputs

    def _advance_grammars(self, runner_out: ModelRunnerOutput, incarnations: dict[str, int]) -> Future | None:
        """Queue each sampled token of a request with a grammar for its matcher: a Future of the verdicts
        (``GrammarVerdict`` by request, for those whose grammar completed or refused a token), or None."""
        if not self._structured:
            return None
        items = []
        for req_id, token_ids in zip(runner_out.req_ids, runner_out.sampled_token_ids):
            req = self._scheduled_incarnation(req_id, incarnations)
            if req is not None and req.grammar is not None and token_ids and req_id not in runner_out.errors:
                items.append((req_id, req.grammar, token_ids))
        return self._grammar_thread().advance(items) if items else None

    def _scheduled_incarnation(self, req_id: str, incarnations: dict[str, int]) -> Request | None:
        """The request a step's output is for, or None: aborted or finished meanwhile, or preempted since the
        step was scheduled (it will recompute)."""
        req = self.requests.get(req_id)
        if req is None or req.is_finished or req.num_preemptions != incarnations.get(req_id, 0):
            return None
        return req

    @staticmethod
    def _grammar_status(req: Request, verdict: GrammarVerdict) -> tuple[RequestStatus, str | None, bool]:
        """A completed grammar stops the request, unless min_tokens bans the EOS that alone may follow; a refused token
        aborts it. The sampler draws a token the grammar masked only where it had no token left: the grammar allowed
        none of those the request's own bans leave (token_bans). That is the request's error (the third value);
        without such bans it is the engine's."""
        if verdict.refused is None:
            error = token_bans.completed_too_early(req)
            return (RequestStatus.FINISHED_STOPPED, None, False) if error is None else (RequestStatus.FINISHED_ABORTED, error, True)
        if token_bans.banning_fields(req):
            return RequestStatus.FINISHED_ABORTED, token_bans.no_token_left(req, grammar=True), True
        return RequestStatus.FINISHED_ABORTED, f"token {verdict.refused} broke the request's grammar: {verdict.error}", False

    def _apply_grammar_verdicts(self, verdicts: Future) -> list[EngineCoreOutput]:
        """Finish the requests whose grammar completed (or failed) on a token of the step before."""
        outputs = []
        for req_id, verdict in verdicts.result().items():
            req = self.requests.get(req_id)
            if req is None or req.is_finished:
                continue
            status, error, invalid = self._grammar_status(req, verdict)
            self._remove(req)
            self._finish(req, status)
            outputs.append(EngineCoreOutput(req_id, [], [], num_cached_tokens=max(req.num_cached_tokens, 0),
                                            finish_reason=status.finish_reason, error=error, invalid=invalid))
        return outputs

    @staticmethod
    def _new_prompt_logprobs(req: Request, computed: tuple[int, list] | None) -> list:
        """The prompt logprob entries of this step not sent before (a request recomputed after a preemption
        computes its prompt again)."""
        if computed is None:
            return []
        first, entries = computed  # entries[i] is for prompt token first + i
        fresh = entries[max(req.num_prompt_logprobs_sent - first, 0):]
        req.num_prompt_logprobs_sent = max(req.num_prompt_logprobs_sent, first + len(entries))
        return fresh

    def _check_stop(self, req: Request, token_id: int) -> RequestStatus | None:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            if token_id in req.eos_token_ids and not params.ignore_eos:
                return RequestStatus.FINISHED_STOPPED
            if token_id in params.stop_token_ids:
                req.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if req.num_output_tokens >= req.max_tokens or req.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _finish(self, req: Request, status: RequestStatus) -> None:
        req.status = status
        req.grammar = req.grammar_future = None
        self._structured.pop(req.request_id, None)
        self.kv.free(req)
        del self.requests[req.request_id]
        if req.num_tokens_sent:
            self._finished_for_workers[req.request_id] = None

    # ---------------------------------------------------------------- reporting

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting) + len(self.compiling),
            kv_cache_usage=self.kv.usage,
            num_free_blocks=self.kv.num_free_blocks,
            num_total_blocks=self.kv.pool.num_blocks - 1,
            num_preemptions=self._num_preemptions,
            num_scheduled_tokens=self._num_scheduled_tokens,
            prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits,
        )
