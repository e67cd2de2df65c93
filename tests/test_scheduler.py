"""Scheduler decisions, driven step by step with the runner's plain output data."""

from __future__ import annotations

from raygrid.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.engine.request import Request, RequestStatus
from raygrid.engine.sampling_params import SamplingParams
from raygrid.engine.scheduler import Scheduler


def make_scheduler(num_blocks=64, block_size=4, budget=16, max_seqs=8, policy="fcfs", chunked=True, max_len=64, long_prefill=0,
                   grammars=None):
    config = EngineConfig(
        model=ModelConfig(model="unused", max_model_len=max_len),
        cache=CacheConfig(block_size=block_size, num_kv_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked, policy=policy,
                                  long_prefill_token_threshold=long_prefill),
    )
    return Scheduler(config, num_blocks, grammars=grammars)


def make_request(req_id, num_prompt, max_tokens=4, priority=0, arrival=None):
    # Distinct tokens per request id, so prompts share no prefix-cache blocks.
    first = 1 + 1000 * (sum(map(ord, req_id)) % 50)
    return Request(req_id, list(range(first, first + num_prompt)), SamplingParams(max_tokens=max_tokens), max_tokens,
                   frozenset({0}), arrival_time=arrival, priority=priority)


def sample_all(sched: Scheduler, out: SchedulerOutput, token=5):
    """What a runner returns: one token for each request whose whole sequence is now computed."""
    ids, tokens = [], []
    for req_id in out.num_scheduled_tokens:
        req = sched.requests[req_id]
        ids.append(req_id)
        tokens.append([token] if req.num_computed_tokens >= req.num_tokens else [])
    return sched.update_from_output(out, ModelRunnerOutput(ids, tokens, [None] * len(ids)))


class ShadowWorker:
    """The workers' view, rebuilt from SchedulerOutputs alone, with a KV cache that holds at each slot
    the token id whose KV was written there. Each step writes its tokens (all of them, as a layer's KV
    store precedes its attention), then checks that every position each request attends over holds
    that request's token: a wrong block table or a prefix-cache hit on an unwritten block fails it."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.kv: dict[int, int] = {}  # slot -> token id written there
        self.tokens: dict[str, list[int]] = {}
        self.blocks: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}

    def slot(self, req_id: str, pos: int) -> int:
        return self.blocks[req_id][pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids:
            self.tokens.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.tokens[new.req_id], self.blocks[new.req_id] = list(new.token_ids), list(new.block_ids)
            self.computed[new.req_id] = new.num_computed_tokens
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            self.tokens[req_id].extend(cached.new_token_ids[i])
            if cached.resumed_from_preemption[i]:
                self.blocks[req_id] = list(cached.new_block_ids[i])
            else:
                self.blocks[req_id].extend(cached.new_block_ids[i])
            self.computed[req_id] = cached.num_computed_tokens[i]
        for req_id, n in out.num_scheduled_tokens.items():
            start = self.computed[req_id]
            for pos in range(start, start + n):
                self.kv[self.slot(req_id, pos)] = self.tokens[req_id][pos]
        for req_id, n in out.num_scheduled_tokens.items():
            end = self.computed[req_id] + n
            seen = [self.kv.get(self.slot(req_id, pos)) for pos in range(end)]
            assert seen == self.tokens[req_id][:end], f"{req_id} attends over KV that is not its own"


def run_to_completion(sched: Scheduler, shadow: ShadowWorker, steps: int = 200) -> None:
    """Synchronous steps; each sampled token depends on the request and position, like a model's would."""
    for _ in range(steps):
        out = sched.schedule()
        if out.is_empty and not sched.has_unfinished_requests():
            return
        shadow.step(out)
        ids = list(out.num_scheduled_tokens)
        tokens = []
        for req_id in ids:
            req = sched.requests[req_id]
            done = req.num_computed_tokens >= req.num_tokens
            tokens.append([100 + (sum(map(ord, req_id)) * 31 + req.num_tokens) % 800] if done else [])
        sched.update_from_output(out, ModelRunnerOutput(ids, tokens, [None] * len(ids)))
    raise AssertionError("requests did not finish")


def test_long_prompt_is_chunked_and_decodes_ride_along():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("short", 3))
    sched.add_request(make_request("long", 40))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"short": 3, "long": 13}
    sample_all(sched, out)
    out = sched.schedule()
    # Running requests first: the decode of "short" (1 token), then the next chunk of "long".
    assert out.num_scheduled_tokens == {"short": 1, "long": 15}
    assert out.scheduled_cached_reqs.new_token_ids == [[5], []]
    assert out.scheduled_new_reqs == []


def test_no_chunked_prefill_waits_for_room():
    sched = make_scheduler(budget=64, chunked=False)
    sched.add_request(make_request("a", 30))
    sched.add_request(make_request("b", 40))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 30}  # b does not fit in what is left and is not split


def test_max_num_seqs_caps_running_requests():
    sched = make_scheduler(budget=100, max_seqs=2)
    for i in range(4):
        sched.add_request(make_request(str(i), 2))
    out = sched.schedule()
    assert list(out.num_scheduled_tokens) == ["0", "1"]
    assert sched.stats().num_waiting == 2


def test_fcfs_preempts_the_newest_request_and_recomputes_it():
    # 6 usable blocks of 4 tokens; two requests of 8 prompt tokens + 8 outputs cannot both grow.
    sched = make_scheduler(num_blocks=7, budget=32, max_len=32)
    sched.add_request(make_request("old", 8, max_tokens=8, arrival=1.0))
    sched.add_request(make_request("new", 8, max_tokens=8, arrival=2.0))
    preempted_seen = False
    for _ in range(40):
        out = sched.schedule()
        if sched.requests.get("new") is not None and sched.requests["new"].status == RequestStatus.PREEMPTED:
            preempted_seen = True
            assert "old" in out.num_scheduled_tokens
        if out.is_empty:
            break
        sample_all(sched, out)
    assert preempted_seen and sched.stats().num_preemptions >= 1
    assert not sched.has_unfinished_requests()
    assert sched.kv.num_free_blocks == 6


def test_resumed_request_gets_its_whole_block_table():
    sched = make_scheduler(num_blocks=7, budget=32, max_len=32)
    sched.add_request(make_request("old", 8, max_tokens=8, arrival=1.0))
    sched.add_request(make_request("new", 8, max_tokens=8, arrival=2.0))
    shadow = ShadowWorker(block_size=4)
    resumed = False
    for _ in range(40):
        out = sched.schedule()
        resumed |= any(out.scheduled_cached_reqs.resumed_from_preemption)
        shadow.step(out)  # the worker's block table after the resume must map every position to its own KV
        if out.is_empty:
            break
        sample_all(sched, out)
    assert resumed, "no request was resumed"
    assert not sched.has_unfinished_requests()


def test_a_block_granted_in_a_withdrawn_step_is_never_a_hit():
    """Priority preemption of a request that was granted tokens earlier in the same step: its blocks had
    been hashed for KV that is now never written. Its resume must not hit them. (Sizes found by a random
    search against the scheduler without the withdrawal, where the resumed "low" reads unwritten KV.)"""
    sched = make_scheduler(num_blocks=13, block_size=4, budget=12, policy="priority", max_len=64, max_seqs=4, long_prefill=8)
    shadow = ShadowWorker(block_size=4)
    low = make_request("low", 37, max_tokens=7, priority=5, arrival=1.0)
    sched.add_request(low)
    withdrawn = False
    for step in range(100):
        if step == 2:  # arrives while low's prompt is being computed in chunks of 8
            sched.add_request(make_request("high", 9, max_tokens=1, priority=0, arrival=2.0))
        computed_before = low.num_computed_tokens
        out = sched.schedule()
        # low preempted in this step although it was running with blocks hashed for this step's chunk
        withdrawn |= low.num_preemptions == 1 and computed_before > 0 and low.num_computed_tokens == 0 and not low.is_finished
        if out.is_empty and not sched.has_unfinished_requests():
            break
        shadow.step(out)
        ids = list(out.num_scheduled_tokens)
        toks = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        sched.update_from_output(out, ModelRunnerOutput(ids, toks, [None] * len(ids)))
    assert withdrawn
    assert not sched.has_unfinished_requests()


def test_stale_outputs_of_a_preempted_incarnation_are_dropped():
    """Three batches in flight (pipeline stages): a request sampled in batch 1 is preempted while batch 1
    runs and re-admitted in batch 3. Batch 1's token belongs to the old incarnation and must not be
    appended; the new incarnation samples that position itself."""
    config = EngineConfig(
        model=ModelConfig(model="unused", max_model_len=64),
        cache=CacheConfig(block_size=4, num_kv_blocks=64),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=16),
    )
    sched = Scheduler(config, 64, num_batches_in_flight=3)
    sched.add_request(make_request("r", 5, max_tokens=4))
    batch1 = sched.schedule()
    req = sched.requests["r"]
    assert batch1.num_scheduled_tokens == {"r": 5}
    sched._preempt(req)  # as a victim while batch 1 is in flight
    batch2 = sched.schedule()  # re-admitted
    assert "r" in batch2.num_scheduled_tokens and batch2.scheduled_cached_reqs.resumed_from_preemption == [True]
    assert sample_all_for(sched, batch1, {"r": 11}) == []  # stale: dropped
    assert req.output_token_ids == []
    (core_out,) = sample_all_for(sched, batch2, {"r": 12})
    assert core_out.new_token_ids == [12] and req.output_token_ids == [12]


def test_priority_policy_preempts_the_lowest_priority():
    sched = make_scheduler(num_blocks=7, budget=32, policy="priority", max_len=32)
    sched.add_request(make_request("low", 8, max_tokens=8, priority=5, arrival=1.0))
    sched.add_request(make_request("high", 8, max_tokens=8, priority=0, arrival=2.0))
    for _ in range(40):
        out = sched.schedule()
        statuses = {r: q.status for r, q in sched.requests.items()}
        if RequestStatus.PREEMPTED in statuses.values():
            assert statuses.get("low") == RequestStatus.PREEMPTED
            return
        sample_all(sched, out)
    raise AssertionError("no preemption happened")


def test_priority_policy_admits_by_priority():
    sched = make_scheduler(budget=4, policy="priority")
    sched.add_request(make_request("later", 4, priority=3, arrival=1.0))
    sched.add_request(make_request("urgent", 4, priority=1, arrival=2.0))
    assert list(sched.schedule().num_scheduled_tokens) == ["urgent"]


def test_stop_conditions_and_finished_ids_reach_the_workers():
    sched = make_scheduler()
    sched.add_request(make_request("eos", 3, max_tokens=10))
    out = sched.schedule()
    (core_out,) = sample_all(sched, out, token=0)  # 0 is the EOS id
    assert core_out.finish_reason == "stop" and core_out.new_token_ids == [0]
    assert sched.schedule().finished_req_ids == ["eos"]

    sched.add_request(make_request("len", 3, max_tokens=2))
    results = []
    for _ in range(3):
        out = sched.schedule()
        if out.is_empty:
            break
        results += sample_all(sched, out)
    assert results[-1].finish_reason == "length" and len(results) == 2


def test_abort_frees_blocks_of_running_and_waiting_requests():
    sched = make_scheduler(budget=8)
    sched.add_request(make_request("a", 6))
    sched.add_request(make_request("b", 6))
    sched.schedule()
    sched.abort_requests(["a", "b"])
    assert not sched.has_unfinished_requests()
    assert sched.kv.num_free_blocks == 63
    assert sched.schedule().finished_req_ids == ["a", "b"]  # in the order they ended: every rank removes them in that order


def test_a_result_for_a_request_preempted_while_in_flight_is_recomputed():
    # With batches in flight (pipeline stages, async scheduling) a request can be preempted after its
    # step was launched; that step's token is dropped and the request computes it again when resumed.
    sched = make_scheduler(num_blocks=16)
    sched.add_request(make_request("r", 5, max_tokens=4))
    out = sched.schedule()
    req = sched.requests["r"]
    sched._preempt(req)
    assert req.status == RequestStatus.PREEMPTED and sched.kv.num_free_blocks == 15
    assert sample_all_for(sched, out, {"r": 0}) == []  # EOS of the old incarnation: ignored
    assert req.status == RequestStatus.PREEMPTED
    out = sched.schedule()
    (core_out,) = sample_all_for(sched, out, {"r": 0})
    assert core_out.finish_reason == "stop"
    assert not sched.has_unfinished_requests() and sched.kv.num_free_blocks == 15


def sample_all_for(sched, out, tokens):
    ids = list(out.num_scheduled_tokens)
    return sched.update_from_output(out, ModelRunnerOutput(ids, [[tokens[i]] for i in ids], [None] * len(ids)))
