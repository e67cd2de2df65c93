"""The real server in a subprocess, driven by the official openai client."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import openai
import pytest

import raygrid
from raygrid import LLM, SamplingParams

MAX_MODEL_LEN = 512


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: str, *extra: str, positional_model: bool = False) -> tuple[subprocess.Popen, str]:
    port = free_port()
    model = [model_dir] if positional_model else ["--model", model_dir]
    cmd = [sys.executable, "-m", "raygrid.entrypoints.cli", "serve", *model, "--served-model-name", "tiny",
           "--port", str(port), "--device", "cpu", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
           "--log-level", "warning", *extra]
    # Its output goes to a file (``proc.log``), not a pipe that nobody reads while it runs: a full pipe would block
    # the server's next log line.
    log = tempfile.NamedTemporaryFile("w+", prefix="raygrid-serve-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log.name
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {open(proc.log).read()[-5000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
    if os.path.exists(proc.log):
        os.unlink(proc.log)


@pytest.fixture(scope="module")
def server(qwen3_dir):
    proc, base = start_server(qwen3_dir)
    yield base
    stop_server(proc)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def offline(qwen3_dir):
    return LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN)


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


PROMPTS = ["Hello, world!", "Once upon a time there was", "The weather in Paris is"]


@pytest.mark.parametrize("stream", [False, True])
def test_completions_match_offline_llm(client, offline, stream):
    expected = offline.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    for prompt, want in zip(PROMPTS, expected):
        kwargs = dict(model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert chunks[-1].usage.completion_tokens == 12
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
        else:
            response = client.completions.create(**kwargs)
            text = response.choices[0].text
            assert response.usage.prompt_tokens == len(want.prompt_token_ids)
            assert response.usage.completion_tokens == 12
            assert response.choices[0].finish_reason == "length"
        assert text == want.outputs[0].text


@pytest.mark.parametrize("stream", [False, True])
def test_chat_matches_offline_llm(client, offline, stream):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is two plus two?"}]
    (want,) = offline.chat(messages, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    kwargs = dict(model="tiny", messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        response = client.chat.completions.create(**kwargs)
        assert response.choices[0].message.role == "assistant"
        assert response.usage.prompt_tokens == len(want.prompt_token_ids)
        text = response.choices[0].message.content
    assert text == want.outputs[0].text


def _sse_chunks(server: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server}{path}", json=body, timeout=60) as response:
        lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_streamed_chunks_have_openais_wire_shape(server):
    """Chunks are written without pydantic: they must still validate as the protocol's models, carry the
    role only in the first chat delta, and carry "usage" only when it was asked for (null until the last)."""
    from raygrid.entrypoints.openai_protocol import ChatCompletionChunk

    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "ignore_eos": True,
            "stream": True, "n": 2}
    chunks = _sse_chunks(server, "/v1/chat/completions", chat)
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk)
        assert "usage" not in chunk
    assert [c["delta"]["role"] for c in chunks[0]["choices"]] == ["assistant", "assistant"]
    assert all("role" not in c["delta"] for chunk in chunks[1:] for c in chunk["choices"])
    assert {c["finish_reason"] for chunk in chunks for c in chunk["choices"]} == {None, "length"}
    assert {chunk["system_fingerprint"] for chunk in chunks} == {f"raygrid-{raygrid.__version__}"}
    with_usage = _sse_chunks(server, "/v1/chat/completions", {**chat, "stream_options": {"include_usage": True}})
    assert all(chunk["usage"] is None for chunk in with_usage[:-1])
    assert with_usage[-1]["choices"] == [] and with_usage[-1]["usage"]["completion_tokens"] == 8
    completion = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "ignore_eos": True, "stream": True}
    plain = _sse_chunks(server, "/v1/completions", completion)
    assert all("usage" not in chunk and chunk["system_fingerprint"].startswith("raygrid-") for chunk in plain)
    whole = httpx.post(f"{server}/v1/chat/completions", json={**chat, "stream": False}, timeout=30).json()
    assert whole["system_fingerprint"] == f"raygrid-{raygrid.__version__}"
    with_usage = _sse_chunks(server, "/v1/completions", {**completion, "stream_options": {"include_usage": True}})
    assert all(chunk["usage"] is None for chunk in with_usage[:-1]) and with_usage[-1]["usage"]["completion_tokens"] == 3


def test_n_seed_stop_and_logprobs(client, offline):
    response = client.completions.create(model="tiny", prompt=PROMPTS[1], n=3, seed=5, temperature=1.0, max_tokens=8,
                                         logprobs=2, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in response.choices) == [0, 1, 2]
    again = client.completions.create(model="tiny", prompt=PROMPTS[1], n=3, seed=5, temperature=1.0, max_tokens=8,
                                      logprobs=2, extra_body={"ignore_eos": True})
    assert [c.text for c in response.choices] == [c.text for c in again.choices]
    for choice in response.choices:
        assert len(choice.logprobs.tokens) == 8 and len(choice.logprobs.top_logprobs) == 8
        # The 2 most likely, and the chosen token where it is not among them (OpenAI's legacy API: up to logprobs + 1).
        assert all(1 <= len(top) <= 3 for top in choice.logprobs.top_logprobs)
        assert all(chosen in top.values() for chosen, top in zip(choice.logprobs.token_logprobs, choice.logprobs.top_logprobs))
        if not any("\ufffd" in t for t in choice.logprobs.tokens):  # a token of a split character decodes alone as U+FFFD
            assert "".join(choice.logprobs.tokens) == choice.text
    assert any(len(top) == 3 for choice in response.choices for top in choice.logprobs.top_logprobs)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 for t in content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob

    full = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    # Two characters from the middle on, none of them U+FFFD: a stop string can only match whole characters,
    # and a U+FFFD in the final text stands for bytes that a stream never shows as such.
    start = next(i for i in range(len(text) // 2, len(text) - 1) if "\ufffd" not in text[i : i + 2])
    stop = text[start : start + 2]
    cut = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.find(stop)]


def test_64_concurrent_streams_complete(server):
    async def one(client, i):
        stream = await client.completions.create(model="tiny", prompt=f"Request number {i} says", max_tokens=10 + i % 7,
                                                 temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True})
        chunks = [c async for c in stream]
        return chunks[-1].usage.completion_tokens, sum(1 for c in chunks if c.choices and c.choices[0].text is not None)

    async def main():
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(64)))
        finally:
            await client.close()

    results = asyncio.run(main())
    assert [tokens for tokens, _ in results] == [10 + i % 7 for i in range(64)]
    assert all(chunks >= 1 for _, chunks in results)


def test_closing_a_stream_frees_its_blocks(server):
    body = {"model": "tiny", "prompt": "A long story:", "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", f"{server}/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for _ in range(6):
                next(line for line in lines if line.startswith("data: "))
            assert metric(server, "raygrid_num_requests_running") == 1
            assert metric(server, "raygrid_kv_cache_usage_perc") > 0
        # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and metric(server, "raygrid_num_requests_running") != 0:
        time.sleep(0.1)
    assert metric(server, "raygrid_num_requests_running") == 0
    assert metric(server, "raygrid_kv_cache_usage_perc") == 0
    assert metric(server, 'raygrid_request_success_total') >= 1


BAD_REQUESTS = [
    ("completions", b"{not json"),
    ("completions", b"[1, 2, 3]"),
    ("completions", {"prompt": "hi"}),  # no model
    ("completions", {"model": "tiny"}),  # no prompt
    ("completions", {"model": "nope", "prompt": "hi"}),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": -5}),
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": "many"}),
    ("completions", {"model": "tiny", "prompt": "hi", "temperature": -1}),
    ("completions", {"model": "tiny", "prompt": "hi", "temperature": 1000}),
    ("completions", {"model": "tiny", "prompt": "hi", "top_p": 0}),
    ("completions", {"model": "tiny", "prompt": "hi", "top_k": -7}),
    ("completions", {"model": "tiny", "prompt": "hi", "n": 0}),
    ("completions", {"model": "tiny", "prompt": "hi", "presence_penalty": 9}),
    ("completions", {"model": "tiny", "prompt": "hi", "logprobs": 50}),
    ("completions", {"model": "tiny", "prompt": "hi", "stop": [""]}),
    ("completions", {"model": "tiny", "prompt": "word " * 600}),  # over the context length
    ("completions", {"model": "tiny", "prompt": "hi", "max_tokens": MAX_MODEL_LEN}),  # prompt + max_tokens too long
    ("completions", {"model": "tiny", "prompt": [5, 10**9]}),  # token id out of range
    ("completions", {"model": "tiny", "prompt": ""}),
    ("completions", {"model": "tiny", "prompt": "hi", "seed": 2**63}),
    ("chat/completions", {"model": "tiny", "messages": []}),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}),
    ("chat/completions", {"model": "tiny", "messages": "hello"}),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
    ("chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "min_tokens": 9, "max_tokens": 3}),
]


def test_bad_requests_get_4xx_and_the_server_carries_on(server):
    with httpx.Client(timeout=30) as http:
        for path, body in BAD_REQUESTS:
            kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
            response = http.post(f"{server}/v1/{path}", **kwargs)
            assert 400 <= response.status_code < 500, (body, response.status_code, response.text)
            error = response.json()["error"]
            assert error["message"] and error["type"], body
        assert http.post(f"{server}/v1/completions", json={"model": "nope", "prompt": "x"}).status_code == 404
        too_long = http.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "word " * 600}).json()["error"]
        assert f"maximum context length is {MAX_MODEL_LEN}" in too_long["message"]
        temp = http.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "x", "temperature": -1}).json()["error"]
        assert temp["param"] == "temperature"
        ok = http.post(f"{server}/v1/completions", json={"model": "tiny", "prompt": "still here?", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    assert httpx.get(f"{server}/health").status_code == 200


def test_models_version_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(f"{server}/version").json()["version"]
    text = httpx.get(f"{server}/metrics").text
    for name in ("raygrid_time_to_first_token_seconds_bucket", "raygrid_inter_token_latency_seconds_bucket",
                 "raygrid_e2e_request_latency_seconds_count", "raygrid_request_queue_time_seconds_count",
                 "raygrid_num_requests_waiting", "raygrid_prefix_cache_queries_total", "raygrid_prefix_cache_hits_total",
                 "raygrid_num_preemptions_total", "raygrid_prompt_tokens_total", "raygrid_generation_tokens_total"):
        assert name in text, name
    assert metric(server, "raygrid_generation_tokens_total") > 0
    assert metric(server, "raygrid_time_to_first_token_seconds_count") > 0


def test_cache_salt_isolates_prefixes(server, client):
    tokens = list(range(100, 180))  # five full blocks

    def hits_after(**extra) -> float:
        client.completions.create(model="tiny", prompt=tokens, max_tokens=1, extra_body=extra)
        time.sleep(0.6)  # the server refreshes its scheduler metrics at least every 0.25 s
        return metric(server, "raygrid_prefix_cache_hits_total")

    start = hits_after(cache_salt="salt-a")
    assert hits_after(cache_salt="salt-b") == start  # other salt: no hit
    assert hits_after(cache_salt="salt-a") == start + 64  # same salt: the four full blocks below the last token
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=tokens, max_tokens=1, extra_body={"cache_salt": ""})
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                          extra_body={"cache_salt": "salt-a"})
    assert chat.choices[0].finish_reason == "length"


def test_api_key(qwen3_dir):
    """--api-key through the openai client; with --metrics-without-auth, /metrics (and /health) alone need no key.
    (Every route needing the key without that flag: tests/test_server_robustness.py.)"""
    proc, base = start_server(qwen3_dir, "--api-key", "sekrit", "--metrics-without-auth")
    try:
        denied = openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            denied.models.list()
        allowed = openai.OpenAI(base_url=f"{base}/v1", api_key="sekrit", max_retries=0)
        assert allowed.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(f"{base}/health").status_code == 200  # health needs no key
        assert httpx.get(f"{base}/metrics").status_code == 200
        assert httpx.get(f"{base}/v1/models").status_code == 401 and httpx.get(f"{base}/version").status_code == 401
    finally:
        stop_server(proc)


def test_bench_serve(server, tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, "-m", "raygrid.entrypoints.cli", "bench", "serve", "--base-url", server, "--num-prompts", "12",
         "--input-len", "20", "--output-len", "6", "--max-concurrency", "4", "--request-rate", "50", "--save-result", str(out),
         "--goodput", "ttft:60000", "tpot:60000",
         "--no-progress"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 12 * 6 and summary["total_input_tokens"] == 12 * 20
    assert all(t is not None and t > 0 for t in summary["ttfts"]), summary["ttfts"]  # every request, text or not
    assert summary["median_ttft_ms"] > 0 and summary["p99_e2el_ms"] >= summary["median_e2el_ms"]
    assert summary["request_goodput"] is not None and summary["request_goodput"] <= summary["request_throughput"]
    assert summary["output_throughput"] > 0
    assert "TTFT (ms)" in result.stdout


def test_bench_serve_counts_a_request_without_tokens_as_failed():
    """A response that carried no token is a failure, never a 0 ms TTFT; goodput counts only SLO-abiding requests."""
    import argparse

    from raygrid.bench.serve import RequestResult, summarize

    args = argparse.Namespace(base_url="x", request_rate=1.0, max_concurrency=None, dataset="random", input_len=4, output_len=4,
                              goodput=["ttft:100"])
    results = [RequestResult(ok=True, prompt_tokens=4, output_tokens=4, ttft=0.05, latency=0.2, itl=[0.05] * 3),
               RequestResult(ok=True, prompt_tokens=4, output_tokens=4, ttft=0.3, latency=0.5, itl=[0.07] * 3),
               RequestResult(ok=False, error="no tokens in the response")]
    summary = summarize(args, results, 2.0, "m")
    assert summary["completed"] == 2 and summary["failed"] == 1
    assert summary["mean_ttft_ms"] == pytest.approx(175.0) and summary["ttfts"][2] is None
    assert summary["request_goodput"] == pytest.approx(0.5)  # one of two met ttft <= 100 ms, over 2 s
    assert summary["mean_tpot_ms"] == pytest.approx((50.0 + 200 / 3) / 2)
