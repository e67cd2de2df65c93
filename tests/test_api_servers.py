"""`raygrid serve --api-server-count 2`: two API server processes share the port and one engine process.
The openai client streams, completes and aborts through them, /metrics counts every request whichever
process served it, a grammar compiles in the engine without a tokenizer of its own there, and SIGKILL of
the engine fails the requests in flight on both servers within seconds, after which the supervisor stops
everything."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import openai

from tests.test_distributed import loaded_libraries
from tests.test_openai_server import metric, start_server, stop_server


def _pids(proc) -> tuple[list[int], int]:
    for _ in range(100):
        found = re.search(r"API servers \(pids ([\d, ]+)\) and the engine process \(pid (\d+)\)", open(proc.log).read())
        if found:
            return [int(p) for p in found.group(1).split(", ")], int(found.group(2))
        time.sleep(0.1)
    raise AssertionError("the supervisor did not report its processes")


def test_two_api_servers_share_one_engine(qwen3_dir):
    proc, base = start_server(qwen3_dir, "--api-server-count", "2")
    try:
        servers, engine_pid = _pids(proc)
        assert len(servers) == 2 and engine_pid not in servers
        # /health answers once either API server accepts; the engine's gauges come from the first one (index 0),
        # which may still be starting (on a cold CI machine it was, and every request went to the other): they are
        # in /metrics once it reports them, idle or not.
        deadline = time.monotonic() + 60
        while "raygrid_num_requests_running" not in httpx.get(f"{base}/metrics").text and time.monotonic() < deadline:
            time.sleep(0.2)
        def connect():  # one client an event loop: its connections belong to the loop
            return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)

        client = connect()

        async def complete(i):
            response = await client.completions.create(model="tiny", prompt=f"request {i}", max_tokens=6,
                                                       extra_body={"ignore_eos": True})
            return response.usage.completion_tokens

        async def stream(i):
            chunks = await client.completions.create(model="tiny", prompt=f"stream {i}", max_tokens=6, stream=True,
                                                     extra_body={"ignore_eos": True})
            return "".join([c.choices[0].text async for c in chunks])

        async def abandon():
            chunks = await client.completions.create(model="tiny", prompt="long", max_tokens=400, stream=True,
                                                     extra_body={"ignore_eos": True})
            async for _ in chunks:
                break
            await chunks.close()

        async def load():
            nonlocal client
            client = connect()
            return await asyncio.gather(*(complete(i) for i in range(24)), *(stream(i) for i in range(16)), abandon())

        results = asyncio.run(load())
        assert results[:24] == [6] * 24 and all(isinstance(text, str) for text in results[24:40])
        # Counted by both processes, summed by whichever answers /metrics.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and metric(base, "raygrid_num_requests_running"):
            time.sleep(0.1)
        finished = {reason: _finished(base, reason) for reason in ("length", "abort")}
        assert finished == {"length": 40, "abort": 1}
        assert metric(base, "raygrid_generation_tokens_total") >= 40 * 6
        assert metric(base, "raygrid_num_requests_running") == 0

        # A grammar through either server: the engine process compiles it with the supervisor's compiler, pickled
        # with its tokenizer's JSON, so no tokenizer loads there (the Rust tokenizers library stays unmapped).
        sync = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        coded = [sync.completions.create(model="tiny", prompt=f"code {i}", max_tokens=10,
                                         extra_body={"guided_regex": "[A-F]{4}-[0-9]{2}"}).choices[0].text for i in range(4)]
        assert all(re.fullmatch("[A-F]{4}-[0-9]{2}", text) for text in coded), coded
        assert not [lib for lib in loaded_libraries(engine_pid) if "/tokenizers/" in lib]

        # The engine dies under load: both servers fail what they have in flight, then the supervisor stops.
        async def in_flight():
            client = connect()
            streams = [await client.completions.create(model="tiny", prompt=f"doomed {i}", max_tokens=400, stream=True,
                                                       extra_body={"ignore_eos": True}) for i in range(8)]
            for s in streams:
                await s.__anext__()
            os.kill(engine_pid, signal.SIGKILL)
            start = time.monotonic()
            outcomes = []
            for s in streams:
                try:
                    async for _ in s:
                        pass
                    outcomes.append("finished")
                except openai.APIError as error:
                    outcomes.append(str(error))
            return outcomes, time.monotonic() - start

        outcomes, elapsed = asyncio.run(in_flight())
        assert elapsed < 10 and all("engine process died" in o for o in outcomes), outcomes
        assert proc.wait(timeout=30) == 1
        assert all(not os.path.exists(f"/proc/{pid}") for pid in servers)
    finally:
        stop_server(proc)


def _finished(base: str, reason: str) -> float:
    import httpx

    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith("raygrid_request_success_total{") and f'finished_reason="{reason}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_serving_freezes_startup_and_defers_full_collections_until_it_ends():
    """While serving, an API server's full collections (its longest stalls under load) neither walk what startup
    made nor come every few hundred thousand allocations: 600,000 live containers, as requests in flight hold,
    bring none, where CPython's defaults bring several. Afterwards the collector is as it was."""
    import gc

    from raygrid.engine.gc_tuning import SERVING_FULL_COLLECTION_AFTER
    from raygrid.entrypoints.api_server import collector_for_serving

    def full_collections_while_holding(n: int) -> int:
        seen = []
        callback = lambda phase, info: seen.append(info["generation"]) if phase == "stop" else None  # noqa: E731
        gc.callbacks.append(callback)
        try:
            held = [[i] for i in range(n)]
        finally:
            gc.callbacks.remove(callback)
        del held
        return seen.count(2)

    before = gc.get_threshold()
    startup = [{} for _ in range(50_000)]  # what an API server's imports, tokenizer and app leave behind
    assert full_collections_while_holding(600_000) >= 2  # the defaults: the test can see them
    with collector_for_serving():
        assert gc.get_freeze_count() >= len(startup)
        assert gc.get_threshold()[2] == SERVING_FULL_COLLECTION_AFTER
        assert full_collections_while_holding(600_000) == 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
