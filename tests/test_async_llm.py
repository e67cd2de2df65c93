"""AsyncLLM: streams, cancellation that frees KV blocks, backpressure, and parity with LLM."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

import pytest

from raygrid import LLM, SamplingParams
from raygrid.engine.async_llm import AsyncLLM, EngineOverloadedError


@pytest.fixture(scope="module")
def engine(qwen3_dir):
    engine = AsyncLLM(qwen3_dir, dtype="float32", device="cpu", max_model_len=512, max_queued_requests=8)
    yield engine
    engine.shutdown()


def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def test_stream_deltas_add_up_to_the_offline_result(engine, qwen3_dir):
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    (want,) = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512).generate("Tell me a story", params, use_tqdm=False)

    async def run():
        text, ids, last = "", [], None
        async for out in engine.generate("Tell me a story", params, delta=True):
            text += out.outputs[0].text
            ids += out.outputs[0].token_ids
            last = out
        return text, ids, last

    text, ids, last = asyncio.run(run())
    assert ids == want.outputs[0].token_ids and text == want.outputs[0].text
    assert last.finished and last.outputs[0].finish_reason == "length"


def test_a_slow_consumer_gets_fewer_larger_deltas_that_still_add_up(engine, qwen3_dir):
    """Outputs that queue up while a stream's consumer is busy are folded into one: n=2 with logprobs,
    the folded deltas still add up to the offline result, completion by completion."""
    params = SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=24, ignore_eos=True, logprobs=2)
    (want,) = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512).generate("Slowly", params, use_tqdm=False)

    async def run():
        got: dict[int, list] = {0: ["", [], []], 1: ["", [], []]}
        chunks = 0
        async for out in engine.generate("Slowly", params, delta=True):
            chunks += 1
            for c in out.outputs:
                got[c.index][0] += c.text
                got[c.index][1] += c.token_ids
                got[c.index][2] += c.logprobs
            await asyncio.sleep(0.3)  # busy elsewhere: the engine runs ahead meanwhile
        return got, chunks

    got, chunks = asyncio.run(run())
    assert chunks < 24
    for completion in want.outputs:
        text, ids, logprobs = got[completion.index]
        assert (text, ids) == (completion.text, completion.token_ids)
        assert [sorted(e) for e in logprobs] == [sorted(e) for e in completion.logprobs]


def test_async_scheduling_streams_match(qwen3_dir):
    """Async scheduling (step N+1 launched before step N's tokens reach the host) behind AsyncLLM."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    (want,) = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512).generate("Async please", params, use_tqdm=False)
    engine = AsyncLLM(qwen3_dir, dtype="float32", device="cpu", max_model_len=512, async_scheduling=True)
    try:
        async def run():
            results = await asyncio.gather(*(collect(engine, "Async please", params) for _ in range(3)))
            return results

        for ids in asyncio.run(run()):
            assert ids == want.outputs[0].token_ids
        assert engine.engine.step_timing()[0]["max_batches_in_flight"] == 2
    finally:
        engine.shutdown()


async def collect(engine, prompt, params):
    ids = []
    async for out in engine.generate(prompt, params, delta=True):
        ids += out.outputs[0].token_ids
    return ids


def test_cancelled_request_is_aborted_and_frees_blocks(engine):
    total = engine.engine.stats().num_total_blocks

    async def run():
        seen = 0

        async def consume():
            nonlocal seen
            async for _ in engine.generate("x", SamplingParams(max_tokens=400, ignore_eos=True)):
                seen += 1

        task = asyncio.create_task(consume())
        while seen < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen

    assert asyncio.run(run()) >= 3
    assert wait_until(lambda: engine.engine.stats().num_free_blocks == total and engine.num_unfinished_requests == 0)
    assert engine.is_healthy


def test_backpressure_refuses_past_the_limit(engine):
    async def run():
        gens = [engine.generate(f"p{i}", SamplingParams(max_tokens=300, ignore_eos=True)) for i in range(8)]
        firsts = [asyncio.ensure_future(g.__anext__()) for g in gens]
        await asyncio.gather(*firsts)
        with pytest.raises(EngineOverloadedError):
            await engine.generate("one too many", SamplingParams(max_tokens=2)).__anext__()
        for g in gens:
            await g.aclose()
        # The limit counts sequences: one request with n=9 is over a limit of 8 on its own.
        assert wait_until(lambda: engine.num_unfinished_requests == 0)
        with pytest.raises(EngineOverloadedError, match="9 more asked for"):
            await engine.generate("many at once", SamplingParams(n=9, max_tokens=2)).__anext__()
        first = await engine.generate("eight is fine", SamplingParams(n=8, max_tokens=2)).__anext__()
        assert first.error is None

    asyncio.run(run())
    assert wait_until(lambda: engine.num_unfinished_requests == 0)


def test_bad_request_raises_and_others_continue(engine):
    async def run():
        good = engine.generate("fine", SamplingParams(max_tokens=5, ignore_eos=True))
        with pytest.raises(ValueError, match="max_model_len"):
            await engine.generate({"prompt_token_ids": [5] * 600}, SamplingParams()).__anext__()
        return [out async for out in good][-1]

    last = asyncio.run(run())
    assert last.finished and len(last.outputs[0].token_ids) == 5


def test_an_id_is_free_again_once_its_request_finishes_or_is_aborted(engine):
    """A request id may be used again as soon as its request has finished or been aborted, and the next request under
    it gets only its own outputs:
    - the server aborts every stream it stops reading, finished or not, and such a late abort must not reach the next
      request under the same id (it once took that one's place, and its stream waited forever);
    - a request aborted mid-stream may still have outputs on their way from the engine when its id is used again
      (each request has an engine id of its own, so they are not taken as the new one's).
    Two requests in flight under one id: the second is refused, the first goes on."""
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    prompt = {"prompt_token_ids": [5, 6, 7]}

    async def run():
        async def whole(request_id):
            return [out async for out in engine.generate(prompt, params, request_id=request_id)][-1]

        async def three(stream):
            for _ in range(3):
                await stream.__anext__()

        finished = []
        for _ in range(5):
            finished.append(await asyncio.wait_for(whole("again"), 30))
            engine.abort("again")  # late: that request has finished
            long = engine.generate({"prompt_token_ids": [9, 9, 9]}, SamplingParams(max_tokens=300, ignore_eos=True),
                                   request_id="again")
            await asyncio.wait_for(three(long), 30)
            await long.aclose()  # aborted mid-stream; its id is taken again at once
        running = engine.generate(prompt, SamplingParams(max_tokens=50, ignore_eos=True), request_id="twice")
        await running.__anext__()
        with pytest.raises(ValueError, match="already in flight"):
            await engine.generate(prompt, params, request_id="twice").__anext__()
        return finished, [out async for out in running][-1]

    finished, last = asyncio.run(run())
    assert all(out.finished and out.request_id == "again" for out in finished)
    assert all(out.outputs[0].token_ids == finished[0].outputs[0].token_ids for out in finished)
    assert len(finished[0].outputs[0].token_ids) == 4 and last.finished and len(last.outputs[0].token_ids) == 50
    assert wait_until(lambda: engine.num_unfinished_requests == 0)
    assert wait_until(lambda: engine.engine.stats().num_free_blocks == engine.engine.stats().num_total_blocks)


def test_abort_ends_the_stream_with_a_last_output_that_finished_with_abort(engine, qwen3_dir):
    """``abort(id)`` from outside a stream ends that stream with a last output whose completions finish with "abort"
    (vLLM's AsyncLLM does the same), mid-stream or before the engine has run a step of it: before, the consumer waited
    for ever. Cumulative outputs carry every token so far (a prefix of the offline result); delta outputs add up to
    it; n=2 ends both completions; the KV blocks come back."""
    prompt = {"prompt_token_ids": [11, 12, 13, 14]}
    greedy = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    (offline,) = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512).generate(prompt, greedy, use_tqdm=False)

    async def mid_stream(request_id, delta, params=greedy):
        outputs = []
        async for out in engine.generate(prompt, params, request_id=request_id, delta=delta):
            outputs.append(out)
            if len(outputs) == 3:
                engine.abort(request_id)
        return outputs

    async def at_once(request_id):
        stream = engine.generate(prompt, greedy, request_id=request_id)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the request is queued for the engine thread, which may or may not have stepped it yet
        engine.abort(request_id)
        return [await first] + [out async for out in stream]

    async def run():
        runs = [await asyncio.wait_for(mid_stream(f"mid-{delta}", delta), 30) for delta in (False, True)]
        runs.append(await asyncio.wait_for(mid_stream("n2", False, SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=200,
                                                                                   ignore_eos=True)), 30))
        early = [await asyncio.wait_for(at_once(f"early-{i}"), 30) for i in range(8)]
        return runs, early

    (cumulative, deltas, n2), early = asyncio.run(run())
    for outputs in (cumulative, deltas, n2, *early):
        last = outputs[-1]
        assert last.finished and all(o.finish_reason == "abort" for o in last.outputs), last
        assert not any(out.finished for out in outputs[:-1])
    assert cumulative[-1].request_id == "mid-False" and len(cumulative) >= 4
    tokens = cumulative[-1].outputs[0].token_ids
    assert 3 <= len(tokens) < 200 and tokens == offline.outputs[0].token_ids[:len(tokens)]
    streamed = [t for out in deltas for c in out.outputs for t in c.token_ids]
    assert 3 <= len(streamed) < 200 and streamed == offline.outputs[0].token_ids[:len(streamed)]
    assert sorted(c.index for c in n2[-1].outputs) == [0, 1]
    assert all(len(outputs[-1].outputs[0].token_ids) < 200 for outputs in early)
    assert wait_until(lambda: engine.num_unfinished_requests == 0)
    assert wait_until(lambda: engine.engine.stats().num_free_blocks == engine.engine.stats().num_total_blocks)


def assert_dead(engine: AsyncLLM) -> None:
    """A dead engine: /health false, and a new request refused with EngineDeadError rather than left waiting."""
    from raygrid.engine.async_llm import EngineDeadError

    assert not engine.is_healthy

    async def late():
        await engine.generate("after", SamplingParams(max_tokens=2)).__anext__()

    with pytest.raises(EngineDeadError):
        asyncio.run(late())


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_engine_core_runs_in_its_own_process_and_its_death_fails_requests(qwen3_dir, fault):
    """The step loop runs in a process of its own; kill -9 of it fails the requests in flight with an
    error within seconds, /health turns false and new requests are refused; nothing hangs. So does a hung engine
    process (SIGSTOP): silent for step_timeout_s with requests in flight, it is killed (it holds the device).
    Before, its requests waited forever and /health stayed true."""
    import os
    import signal

    engine = AsyncLLM(qwen3_dir, dtype="float32", device="cpu", max_model_len=512, step_timeout_s=2)
    try:
        process = engine.engine._owned.process
        assert process.pid != os.getpid() and process.is_alive() and engine.is_healthy

        async def run():
            gens = [engine.generate(f"story {i}", SamplingParams(max_tokens=400, ignore_eos=True), delta=True) for i in range(3)]
            firsts = await asyncio.gather(*(g.__anext__() for g in gens))
            assert all(f.error is None for f in firsts)
            os.kill(process.pid, getattr(signal, fault))
            start = time.monotonic()
            lasts = []
            for gen in gens:
                async for out in gen:
                    last = out
                lasts.append(last)
            return lasts, time.monotonic() - start

        lasts, elapsed = asyncio.run(asyncio.wait_for(run(), 30))  # a TimeoutError, not a hung suite, if it regresses
        assert elapsed < (5 if fault == "SIGKILL" else 2 + 5)
        words = "engine process died" if fault == "SIGKILL" else "the engine process made no progress for 2 s (step_timeout_s 2)"
        assert all(out.finished and words in out.error for out in lasts), [out.error for out in lasts]
        process.join(timeout=5)
        assert not process.is_alive()
        assert_dead(engine)
    finally:
        engine.shutdown()


def test_an_engine_in_this_process_whose_step_does_not_return_is_declared_dead(qwen3_dir):
    """With the engine stepping on a thread of this process (``raygrid serve --engine-in-process``), a step that does
    not return within twice step_timeout_s (a stopped GPU, a collective that never completes) fails the requests in
    flight with the reason, turns /health false and refuses new requests: before, they waited forever and /health
    stayed true. A real step stands for the hang: a 2,000-token prompt's prefill, one step on the CPU (0.22 to 0.24 s
    on two cores, on a day the machine ran at about half its usual pace), against 2 x 0.01 s."""
    from raygrid.engine.async_llm import EngineDeadError

    engine = AsyncLLM(qwen3_dir, dtype="float32", device="cpu", max_model_len=2048, engine_process=False,
                      step_timeout_s=0.01)
    try:
        assert engine.is_healthy

        async def run():
            ids = random.Random(7).choices(range(10, 200), k=2000)  # no prefix the engine has seen
            async for _ in engine.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=4)):
                pass

        with pytest.raises(EngineDeadError, match=r"the engine made no progress for \d+ s: a step has not returned in "
                                                  r"2 x step_timeout_s \(0.02 s\)"):
            asyncio.run(asyncio.wait_for(run(), 30))
        assert_dead(engine)
    finally:
        engine.shutdown()
    assert not engine._watchdog.is_alive() and not engine._thread.is_alive()


def test_a_step_for_hundreds_of_streams_reaches_the_event_loop_in_slices(qwen3_dir):
    """240 streams, whose consumers each spend 0.3 ms a chunk (as a server encoding and sending one), take each
    step's outputs as a wave of the event loop's work. A socket that becomes readable meanwhile (a /health
    probe, written by another thread at random moments) is served after a slice of that wave, not after all of
    it: counted in chunks consumed while it waited, so the check does not depend on the machine's speed."""
    from raygrid.engine.async_llm import _Deliveries

    engine = AsyncLLM(qwen3_dir, dtype="float32", device="cpu", max_model_len=512, max_num_seqs=256, max_queued_requests=1000)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    consumed = 0
    waits: list[int] = []
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    sent_at: list[int] = []
    finished = threading.Event()

    async def consume(i):
        nonlocal consumed
        async for _ in engine.generate({"prompt_token_ids": [i % 50 + 1] * 8}, params, delta=True):
            deadline = time.perf_counter() + 0.0003
            while time.perf_counter() < deadline:
                pass
            consumed += 1

    def on_readable():
        reader.recv(1)
        waits.append(consumed - sent_at.pop())

    def probe():
        rng = random.Random(0)
        while not finished.wait(rng.uniform(0.005, 0.03)):
            if not sent_at:
                sent_at.append(consumed)
                writer.send(b"x")

    async def run():
        asyncio.get_running_loop().add_reader(reader, on_readable)
        await asyncio.gather(*(consume(i) for i in range(240)))

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        asyncio.run(run())
    finally:
        finished.set()
        prober.join()
        reader.close(), writer.close()
        engine.shutdown()
    assert consumed >= 240 and len(waits) >= 10, (consumed, len(waits))
    # All at once, a probe waits behind the rest of a wave (up to 240 chunks); in slices, behind one or two.
    assert max(waits) <= 3 * _Deliveries.SLICE, f"a probe waited for {max(waits)} chunks: {sorted(waits)[-10:]}"
