"""Scheduler decisions, driven step by step with the runner's plain output data."""

from __future__ import annotations

from raygrid.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.engine.request import Request, RequestStatus
from raygrid.engine.sampling_params import SamplingParams
from raygrid.engine.scheduler import Scheduler


def make_scheduler(num_blocks=64, block_size=4, budget=16, max_seqs=8, policy="fcfs", chunked=True, max_len=64):
    config = EngineConfig(
        model=ModelConfig(model="unused", max_model_len=max_len),
        cache=CacheConfig(block_size=block_size, num_kv_blocks=num_blocks),
        scheduler=SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked, policy=policy),
    )
    return Scheduler(config, num_blocks)


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
    for _ in range(40):
        out = sched.schedule()
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            if cached.resumed_from_preemption[i]:
                assert cached.new_block_ids[i] == sched.kv.block_ids(req_id)
                # Recompute starts over, from what the prefix cache still holds of its own blocks.
                req = sched.requests[req_id]
                assert cached.num_computed_tokens[i] % 4 == 0
                assert cached.num_computed_tokens[i] + out.num_scheduled_tokens[req_id] == req.num_tokens
                return
        sample_all(sched, out)
    raise AssertionError("no request was resumed")


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
    assert sched.schedule().finished_req_ids == {"eos"}

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
    assert sched.schedule().finished_req_ids == {"a", "b"}


def test_a_result_for_a_request_preempted_while_in_flight():
    # With batches in flight (pipeline stages, async scheduling) a request can be preempted after its
    # step was launched; the step's token still counts, and may end the request.
    sched = make_scheduler(num_blocks=16)
    sched.add_request(make_request("r", 5, max_tokens=4))
    out = sched.schedule()
    req = sched.requests["r"]
    sched._preempt(req)
    assert req.status == RequestStatus.PREEMPTED and sched.kv.num_free_blocks == 15
    (core_out,) = sample_all_for(sched, out, {"r": 0})  # EOS
    assert core_out.finish_reason == "stop"
    assert not sched.has_unfinished_requests() and sched.kv.num_free_blocks == 15


def sample_all_for(sched, out, tokens):
    ids = list(out.num_scheduled_tokens)
    return sched.update_from_output(out, ModelRunnerOutput(ids, [[tokens[i]] for i in ids], [None] * len(ids)))
