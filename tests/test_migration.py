"""Request migration and replica rebuild (cluster/ray_engine.py, engine/migration.py) on a real local Ray
cluster: a worker is SIGKILLed or SIGSTOPped mid-batch, once the front end has received a given number of
tokens (not by a timer, so the fault lands mid-generation on any machine). The requests of the failed
replica continue on another (or on the rebuilt one) and end exactly as an undisturbed run, for every
sampling parameter; the limits (max_migrations, migration_timeout_s) fail requests with errors that say
which; the rebuilt replica serves again. The same through `raygrid serve` and the openai client."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
import ray

from raygrid import LLM, SamplingParams
from tests.conftest import free_cpus_once_settled, random_prompts
from tests.test_distributed import every_parameter_in_one_process, outputs_agree, resume, worker_pid
from tests.test_openai_server import start_server, stop_server

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the session's (conftest.py)

GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)


def generate_with_faults(llm: LLM, prompts, params, faults: list[tuple[int | Callable[[int], bool], Callable]]) -> list:
    """``llm.generate`` through its LLMEngine's steps, calling each fault in turn once the front end has received
    that many output tokens in all (or once its predicate of that number holds); outputs in prompt order."""
    engine, faults = llm.llm_engine, list(faults)
    params = params if isinstance(params, list) else [params] * len(prompts)
    ids = []
    for prompt, p in zip(prompts, params):
        ids.append(engine.next_request_id())
        engine.add_request(ids[-1], prompt, p)
    start, finished = engine.num_generated_tokens, {}

    def due(when) -> bool:
        tokens = engine.num_generated_tokens - start
        return when(tokens) if callable(when) else tokens >= when

    while engine.has_unfinished_requests():
        for output in engine.step(emit_unfinished=False):
            finished[output.request_id] = output
        while faults and due(faults[0][0]):
            faults.pop(0)[1]()
    assert not faults, "the run ended before every fault"
    return [finished[i] for i in ids]


def after_moves(llm: LLM, moves: int, tokens: int) -> Callable[[int], bool]:
    """A fault's trigger: ``moves`` more migrations have been placed, and the front end has received ``tokens``
    output tokens and 8 more after the moves (two steps of a replica serving 4 requests: the one in flight at
    the moves and the one that sent the moved requests), so that the moved requests have reached their replica."""
    target, moved_at = llm.get_stats().request_migrations + moves, []

    def due(received: int) -> bool:
        if not moved_at and llm.get_stats().request_migrations >= target:
            moved_at.append(received)
        return bool(moved_at) and received >= max(tokens, moved_at[0] + 8)
    return due


def wait_serving(llm: LLM, timeout_s: float = 120.0) -> None:
    """Step the idle engine until every replica is back in service."""
    deadline = time.monotonic() + timeout_s
    while not all(llm.engine.healthy):
        assert time.monotonic() < deadline, f"replicas not rebuilt: {llm.engine.healthy}"
        llm.engine.step()
        time.sleep(0.05)


def test_killed_replicas_migrate_every_kind_of_request_and_limits_fail_requests_with_errors_that_say_which(
        model_dirs, tokenizer, caplog):
    """DP=2 with async scheduling (the GPU default, whose tokens in flight a migration drops), max_migrations=1
    and migration_timeout_s=1, on one engine:

    1. A request per sampling feature (penalties, min_tokens, stop tokens, seeded sampling, n=2, logprobs,
       prompt logprobs, a grammar); a worker of replica 0 is SIGKILLed mid-batch. Every output equals one
       process's; each migration is logged with the request, the failure and the new replica; replica 0 is
       rebuilt and serves again.
    2. The limits: replica 0 dies and its requests move to replica 1; then replica 1 dies while replica 0 is
       still being rebuilt. The moved requests fail on max_migrations, the others after waiting 1 s for a
       replica, each error naming the failure; later requests are served by the rebuilt replicas.
    (The other tests here migrate without async scheduling.)"""
    path = model_dirs["qwen3"]
    prompts, params, expected = every_parameter_in_one_process(path, tokenizer)
    llm = LLM(model=path, device="cpu", dtype="float32", max_model_len=256, max_num_batched_tokens=64, data_parallel_size=2,
              async_scheduling=True, max_migrations=1, migration_timeout_s=1.0)
    try:
        pid = worker_pid(llm, 0, 0)
        with caplog.at_level(logging.WARNING, logger="raygrid.cluster.ray_engine"):
            outputs = generate_with_faults(llm, prompts, params, [(60, lambda: os.kill(pid, signal.SIGKILL))])
        assert all(o.error is None for o in outputs), [o.error for o in outputs]
        outputs_agree(outputs, expected)
        stats = llm.get_stats()
        moves = [r.getMessage() for r in caplog.records if "migrates" in r.getMessage()]
        assert stats.request_migrations == len(moves) >= 3, moves
        assert all("to engine replica 1" in m and "engine replica 0 failed: execute_model failed on rank 0" in m for m in moves)
        assert any("token(s) made" in m and " 0 token(s)" not in m for m in moves), "no request moved mid-decode"
        wait_serving(llm)
        assert llm.get_stats().replica_rebuilds == 1
        steps_before = llm.engine.step_timing()[0]["num_steps"]
        again = llm.generate(prompts[:2], params[:2], use_tqdm=False)  # the least loaded first: the rebuilt replica 0
        outputs_agree(again, expected[:2])
        assert llm.engine.step_timing()[0]["num_steps"] > steps_before, "the rebuilt replica did not serve"

        limited = [{"prompt_token_ids": p} for p in random_prompts(8, len(tokenizer), seed=42)]
        pids = [worker_pid(llm, replica, 0) for replica in (0, 1)]
        outputs = generate_with_faults(llm, limited, GREEDY, [(40, lambda: os.kill(pids[0], signal.SIGKILL)),
                                                              (after_moves(llm, 4, 80), lambda: os.kill(pids[1], signal.SIGKILL))])
        for i, output in enumerate(outputs):  # the router alternates between the idle replicas, replica 0 first
            if i % 2 == 0:
                assert "engine replica 1 failed" in output.error and "had moved 1 time(s): max_migrations is 1" in output.error
            else:
                assert output.error.startswith("no engine replica could take the request within migration_timeout_s=1 s "
                                               "after: engine replica 1 failed: execute_model failed on rank 0")
            assert 0 < len(output.outputs[0].token_ids) < 48
        wait_serving(llm)

        # 3. Both replicas die at once: a request moved to the other replica but not yet sent to it when that one
        # failed too waits again for a replica; its error still names the failure it was moving from.
        both = [worker_pid(llm, replica, 0) for replica in (0, 1)]
        outputs = generate_with_faults(llm, limited, GREEDY, [(40, lambda: [os.kill(pid, signal.SIGKILL) for pid in both])])
        errors = [o.error for o in outputs]
        assert all("had moved 1 time(s): max_migrations is 1" in e or " s after: engine replica " in e for e in errors), errors
        wait_serving(llm)
        late = llm.generate(limited[:2], GREEDY, use_tqdm=False)
        assert all(o.error is None and len(o.outputs[0].token_ids) == 48 for o in late)
        assert llm.get_stats().replica_rebuilds == 5
    finally:
        llm.shutdown()


def test_hung_only_replica_is_rebuilt_and_its_requests_wait_for_it(model_dirs, tokenizer):
    """One replica on Ray (one worker taking every free CPU of the cluster, steps through the compiled graph): its
    worker is SIGSTOPped mid-batch. Every replica is then down, so the requests wait for the rebuild, which fits
    only because the hung replica's placement group was released; then they complete as the undisturbed run did."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, len(tokenizer), seed=41)]
    llm = LLM(model=model_dirs["qwen3"], device="cpu", dtype="float32", max_model_len=256, step_timeout_s=3.0,
              compiled_graph=True, distributed_executor_backend="ray", ray_worker_cpus=free_cpus_once_settled(),
              migration_timeout_s=60)
    pid = worker_pid(llm, 0, 0)
    try:
        expected = llm.generate(prompts, GREEDY, use_tqdm=False)
        outputs = generate_with_faults(llm, prompts, GREEDY, [(40, lambda: os.kill(pid, signal.SIGSTOP))])
        assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]
        assert all(o.error is None and len(o.outputs[0].token_ids) == 48 for o in outputs)
        stats = llm.get_stats()
        assert stats.request_migrations == 4 and stats.replica_rebuilds == 1 and llm.engine.healthy == [True]
    finally:
        resume(pid)
        llm.shutdown()


# ---------------------------------------------------------------------- through `raygrid serve` and the openai client


def worker_pids_by_replica() -> dict[int, int]:
    """Replica index -> the pid of its rank-0 worker, for the engine of the `raygrid serve` process on this cluster."""
    pids = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        name = entry["name"]
        if name.startswith("raygrid-") and name.endswith("-rank0"):
            replica = int(name.rsplit("-replica", 1)[1].split("-")[0])
            pids[replica] = ray.get(ray.get_actor(name, namespace=entry["namespace"]).pid.remote())
    return pids


def stream_all(client: openai.OpenAI, prompts, faults: list[tuple] = ()) -> list[tuple[str, list[str], int]]:
    """Every prompt as a streaming greedy completion of 64 tokens, all at once; each fault ``(trigger, action)`` runs
    once, in order, when its trigger holds: an int is that many chunks received in all, a callable is asked with
    the chunks each stream has received. Per prompt: the text, the tokens (from the logprobs) and the usage's
    completion_tokens."""
    faults, counts, lock = list(faults), [0] * len(prompts), threading.Lock()

    def due(trigger) -> bool:
        return trigger(counts) if callable(trigger) else sum(counts) >= trigger

    def one(index_prompt):
        index, prompt = index_prompt
        text, tokens, usage = "", [], None
        for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=64, temperature=0, logprobs=0,
                                               stream=True, stream_options={"include_usage": True},
                                               extra_body={"ignore_eos": True}):
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
            if chunk.choices:
                text += chunk.choices[0].text
                tokens += chunk.choices[0].logprobs.tokens if chunk.choices[0].logprobs else []
                with lock:
                    counts[index] += 1
                    while faults and due(faults[0][0]):
                        faults.pop(0)[1]()
        return text, tokens, usage

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(one, enumerate(prompts)))
    assert not faults, "the streams ended before every fault"
    return results


def metric_value(base: str, name: str) -> float:
    """The sum of a metric's series on /metrics (0 when it has none)."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(f"{base}/metrics").text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def wait_metric(base: str, name: str, value: float, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while metric_value(base, name) != value:
        assert time.monotonic() < deadline, f"{name} is {metric_value(base, name)}, not {value}"
        time.sleep(0.5)


def test_serve_streams_survive_killed_and_hung_replicas(qwen3_dir, tokenizer):
    """`raygrid serve -dp 2` and 48 concurrent streams of 64 greedy tokens through the openai client, three times:
    undisturbed; with a worker of replica 0 SIGKILLed mid-run (its streams move to replica 1); at once again,
    with replica 1's worker SIGSTOPped mid-run (a hang, caught by the 3 s step deadline) while replica 0 is
    still being rebuilt, so its streams wait for a rebuild. Each disturbed run's streams equal the undisturbed
    run's, text and tokens, none repeated or lost; /metrics counts the migrations and the rebuilds; the rebuilt
    replicas serve; then SIGTERM drains the server."""
    address = ray.get_runtime_context().gcs_address
    proc, base = start_server(qwen3_dir, "-dp", "2", "--step-timeout-s", "3", "--ray-address", address)
    stopped: list[int] = []
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=180)
        prompts = random_prompts(48, len(tokenizer), seed=43)
        expected = stream_all(client, prompts)
        assert all(len(tokens) == usage == 64 for _, tokens, usage in expected)

        pids = worker_pids_by_replica()
        assert sorted(pids) == [0, 1]
        killed = stream_all(client, prompts, [(48 * 10, lambda: os.kill(pids[0], signal.SIGKILL))])
        assert killed == expected
        migrations = metric_value(base, "raygrid_request_migrations_total")
        assert migrations >= 1

        stopped.append(pids[1])
        hung = stream_all(client, prompts, [(48 * 10, lambda: os.kill(pids[1], signal.SIGSTOP))])
        assert hung == expected
        assert metric_value(base, "raygrid_request_migrations_total") > migrations
        wait_metric(base, "raygrid_replica_rebuilds_total", 2)
        assert metric_value(base, "raygrid_engine_replica_healthy") == 2
        assert stream_all(client, prompts[:4]) == expected[:4]
        check_sigterm_drains(proc, base, client, prompts[:4])
    finally:
        for pid in stopped:
            resume(pid)
        stop_server(proc)


def check_sigterm_drains(proc, base: str, client: openai.OpenAI, prompts) -> None:
    """SIGTERM while streams of 300 tokens run: the server refuses new connections at once, finishes every
    stream in flight (they go on after the signal, to their length), and exits cleanly."""
    refused, signalled = [], []

    def terminate_and_knock():
        signalled.append(time.monotonic())
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not refused:
            try:
                httpx.get(f"{base}/health", timeout=1)
                time.sleep(0.05)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                # Refused, or reset unanswered: a connection already queued when the server closed its listening
                # socket is reset, not served (seen once in CI, 2026-12-02).
                refused.append(True)

    def one(prompt):
        finish, last = None, 0.0
        for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=300, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
            if chunk.choices:
                finish, last = chunk.choices[0].finish_reason or finish, time.monotonic()
        return finish, last

    with concurrent.futures.ThreadPoolExecutor(len(prompts) + 1) as pool:
        streams = [pool.submit(one, p) for p in prompts]
        time.sleep(0.5)  # the streams are under way
        knocker = pool.submit(terminate_and_knock)
        ends = [s.result() for s in streams]
        knocker.result()
    assert refused, "the draining server still took new connections"
    assert [finish for finish, _ in ends] == ["length"] * len(prompts), ends
    assert max(last for _, last in ends) > signalled[0], "the streams had ended before the signal"
    assert proc.wait(timeout=60) == 0
