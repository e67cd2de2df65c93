"""The Ray Serve application on the session's local Ray cluster, started the way users start it:
``raygrid serve --ray-serve`` joining the cluster, with two engine replicas behind Serve's HTTP proxy. The
official openai client talks to it; an engine process is SIGKILLed and Serve replaces its replica while the
app keeps answering; the metrics reach Ray's metrics endpoint under the names the dashboard reads."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import glob
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest
import ray
from ray import serve
from ray.util.placement_group import placement_group_table

from raygrid import LLM, SamplingParams
from raygrid.engine.outputs import EngineCoreOutput, decode_outputs
from raygrid.engine.request import Request
from raygrid.entrypoints.cli import build_parser, engine_kwargs
from raygrid.observability.dashboard import PREFIXES, metric_names
from raygrid.serve import ServeArgs, build_app
from raygrid.serve.engine_server import EngineServer
from raygrid.serve.run import serve_args_from_cli
from tests.conftest import RAY_METRICS_PORT, free_port, random_prompts

ENGINE_FLAGS = ["--device", "cpu", "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8",
                "--num-kv-blocks", "24",  # a small pool: a burst of long requests preempts
                "--step-timeout-s", "10"]  # an engine process silent for 10 s with requests in flight is hung


@pytest.fixture(scope="module")
def app(ray_cluster, qwen3_dir, tmp_path_factory):
    port = free_port()
    address = ray.get_runtime_context().gcs_address  # now: tests/test_multinode.py restarts the session cluster
    cmd = [sys.executable, "-m", "raygrid.entrypoints.cli", "serve", qwen3_dir, "--ray-serve", "--ray-address", address,
           "--served-model-name", "tiny", "-dp", "2", "--port", str(port), "--log-level", "warning", *ENGINE_FLAGS]
    log = tmp_path_factory.mktemp("serve") / "raygrid-serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, log.read_text()[-5000:]
        try:  # up once Serve calls the application running: the ingress and both engine replicas
            application = serve.status().applications.get("raygrid")
            if application is not None and application.status == "RUNNING" and httpx.get(f"{url}/v1/models", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"the Serve application did not come up in 240 s:\n{log.read_text()[-5000:]}"
        time.sleep(1)
    yield url
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 0, log.read_text()[-5000:]
    assert "raygrid" not in serve.status().applications, "the application outlived `raygrid serve --ray-serve`"
    serve.shutdown()


def processes() -> list[tuple[int, int, bytes]]:
    """(pid, parent pid, command line) of this machine's processes."""
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            ppid = int(open(stat).read().rsplit(")", 1)[1].split()[1])
            cmdline = open(stat.replace("stat", "cmdline"), "rb").read()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        found.append((int(stat.split("/")[2]), ppid, cmdline))
    return found


def engine_replicas() -> dict[int, list[int]]:
    """EngineServer replica processes (Ray titles them after their actor class) -> the engine processes they
    spawned."""
    table = processes()
    replicas = [pid for pid, _, cmd in table if cmd.startswith(b"ray::ServeReplica:raygrid:EngineServer")]
    return {r: [pid for pid, ppid, cmd in table if ppid == r and b"spawn_main" in cmd] for r in replicas}


def cpu_ticks(pid: int) -> int:
    """A process's CPU time so far, in clock ticks (10 ms each): utime + stime."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def busy_engine_fault(before: dict[int, list[int]], signum: int) -> tuple[Callable[[], None], dict]:
    """A fault for stream_all, and the dict in which it records the replica and the pid it hit: ``signum`` to the
    engine process that is generating. Run early in the streams (32 of their about 1,000 chunks), that engine's
    requests have been heard from by the ingress and are far from done, so they move as migrations (a request whose
    replica fails before its first output is sent again, and not counted). A fixed replica may have had none heard
    from yet; waiting for every stream's first token came too late: with 8 sequences and 24 KV blocks a replica,
    streams start in waves, and the last started after one replica had finished its own.

    Which engine is generating: the one that used the most CPU time over the last second, sampled every 0.1 s on a
    thread from now on, so the fault picks at once. Measuring only when the fault ran held every stream (the fault
    runs under stream_all's lock) for windows of 0.3 s, in which the engines could finish their requests; a CI run
    then stopped an engine with none, and nothing waited on it."""
    pids = [pid for (pid,) in before.values()]
    samples: collections.deque = collections.deque(maxlen=11)  # the last second's samples, 0.1 s apart
    done = threading.Event()

    def sample() -> None:
        deadline = time.monotonic() + 120  # a fault that never runs leaves no thread behind for long
        while not done.is_set() and time.monotonic() < deadline:
            samples.append({pid: cpu_ticks(pid) for pid in pids})
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True, name="busy-engine-sampler")
    sampler.start()
    hit: dict = {}

    def fault() -> None:
        done.set()
        sampler.join()
        oldest, now = samples[0], {pid: cpu_ticks(pid) for pid in pids}
        pid = max(pids, key=lambda p: now[p] - oldest[p])
        hit["replica"], hit["pid"] = next(replica for replica, pids_ in before.items() if pids_ == [pid]), pid
        os.kill(pid, signum)

    return fault, hit


def test_an_engine_replica_refuses_a_request_id_already_in_flight_and_the_first_runs_on(ray_cluster, qwen3_dir):
    """EngineServer.generate (the deployment's own call, which an application of the user's may make) keeps one stream
    a request id. A second call with an id in flight is refused; before, it took the id's stream over, the engine
    refused its request, and the first call waited for ever."""
    server = EngineServer({"model_loading_config": {"model_id": "tiny", "model_source": qwen3_dir},
                           "engine_kwargs": {"device": "cpu", "dtype": "float32", "max_model_len": 256}})
    params = SamplingParams(max_tokens=24, ignore_eos=True)

    async def run() -> list[EngineCoreOutput]:
        first = server.generate(Request("same", [5, 6, 7], params, 24))
        outputs = decode_outputs((await anext(first)).outputs)
        with pytest.raises(ValueError, match="'same' is already in flight on this replica"):
            await anext(server.generate(Request("same", [8, 9], params, 24)))
        async for batch in first:
            outputs += decode_outputs(batch.outputs)
        return outputs

    try:
        outputs = asyncio.run(asyncio.wait_for(run(), timeout=120))
        assert sum(len(out.new_token_ids) for out in outputs) == 24 and outputs[-1].finish_reason == "length"
        assert not outputs[-1].error
        # The id is free again once its call has ended.
        again = asyncio.run(asyncio.wait_for(_collect(server.generate(Request("same", [8, 9], params, 24))), timeout=120))
        assert sum(len(out.new_token_ids) for out in again) == 24
    finally:
        server.shutdown()


async def _collect(stream) -> list[EngineCoreOutput]:
    return [out async for batch in stream for out in decode_outputs(batch.outputs)]


def test_openai_routes_through_serve(app, qwen3_dir, tokenizer):
    client = openai.OpenAI(base_url=f"{app}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    # Greedy completions through Serve equal the offline engine's, for several prompts spread over the replicas.
    prompts = random_prompts(6, len(tokenizer), seed=61)
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    expected = [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                           SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)]
    llm.shutdown()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=10, temperature=0,
                                                                extra_body={"ignore_eos": True}), prompts))
    assert [r.choices[0].text for r in got] == expected
    assert all(r.usage.completion_tokens == 10 and r.choices[0].finish_reason == "length" for r in got)
    # Chat, whole and streamed, agree; n=2 sampled with a seed gives two choices.
    messages = [{"role": "user", "content": "Say something."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    sampled = client.completions.create(model="tiny", prompt="hello there", max_tokens=6, n=2, temperature=1.0, seed=5)
    assert sorted(c.index for c in sampled.choices) == [0, 1]
    # A bad request is refused by the ingress with the field named, and the app goes on serving.
    with pytest.raises(openai.BadRequestError, match="maximum context length is 256 tokens"):
        client.completions.create(model="tiny", prompt="x", max_tokens=10_000)
    # Metrics are Ray's to export under Serve; /metrics says where they are.
    answer = httpx.get(f"{app}/metrics")
    assert answer.status_code == 404 and "Ray's metrics endpoint" in answer.json()["error"]["message"]


def test_metrics_reach_rays_endpoint_under_the_dashboards_names(app, tokenizer):
    """After a burst that preempts and a repeated prompt that hits the prefix cache, every series the Grafana
    dashboard reads (with its "Ray Serve" prefix) is on Ray's metrics endpoint, the engine gauges once per
    replica."""
    client = openai.OpenAI(base_url=f"{app}/v1", api_key="unused", max_retries=0)
    shared = random_prompts(1, len(tokenizer), min_len=40, max_len=41, seed=62)[0]
    for _ in range(3):  # two replicas: at least two of the three land on one of them
        client.completions.create(model="tiny", prompt=shared, max_tokens=2)
    long = random_prompts(8, len(tokenizer), min_len=40, max_len=41, seed=63)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.completions.create(model="tiny", prompt=p, max_tokens=180, temperature=0,
                                                          extra_body={"ignore_eos": True}), long))
    wanted = metric_names(PREFIXES["Ray Serve"], features=frozenset())  # dense, and nothing failed yet: no EPLB, no migrations
    deadline, text = time.monotonic() + 60, ""
    while time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{RAY_METRICS_PORT}/metrics", timeout=10).text
        if wanted <= set(re.findall(r"^(ray_raygrid_[a-z0-9_]+)\{", text, re.M)):
            break
        time.sleep(2)
    exported = set(re.findall(r"^(ray_raygrid_[a-z0-9_]+)\{", text, re.M))
    assert wanted <= exported, sorted(wanted - exported)
    running = re.findall(r'^ray_raygrid_num_requests_running\{[^}]*replica="([^"]+)"', text, re.M)
    assert len(set(running)) >= 2, "each engine replica reports its own scheduler"
    assert re.search(r'^ray_raygrid_num_preemptions_total\{[^}]*deployment="EngineServer"', text, re.M)


def test_killed_engine_process_is_replaced_and_the_app_keeps_answering(app, tokenizer):
    """16 streams in flight when an engine process is SIGKILLed: those of its replica migrate through the ingress to
    the other replica and go on behind the same HTTP streams, each ending as an undisturbed run (text and
    tokens), and the ingress counts the migrations on Ray's metrics endpoint; Serve replaces the replica, and
    requests keep being answered meanwhile."""
    from tests.test_migration import stream_all

    client = openai.OpenAI(base_url=f"{app}/v1", api_key="unused", max_retries=0, timeout=60)
    prompts = random_prompts(16, len(tokenizer), seed=66)
    expected = stream_all(client, prompts)
    before = engine_replicas()
    assert len(before) == 2 and all(len(pids) == 1 for pids in before.values()), before
    kill_a_busy_engine, killed = busy_engine_fault(before, signal.SIGKILL)
    assert stream_all(client, prompts, [(32, kill_a_busy_engine)]) == expected
    victim = killed["replica"]
    # The ingress counts its migrations on Ray's metrics endpoint, under the dashboard's name.
    deadline, migrated = time.monotonic() + 60, []
    while not migrated and time.monotonic() < deadline:
        text = httpx.get(f"http://127.0.0.1:{RAY_METRICS_PORT}/metrics", timeout=10).text
        migrated = [float(v) for v in re.findall(r"^ray_raygrid_request_migrations_total\{[^}]*\} (\S+)", text, re.M)]
        time.sleep(1)
    assert migrated and sum(migrated) >= 1, f"no migration counted after the engine of replica {victim} was killed"
    answered, replaced_at = 0, None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (replaced_at is None or time.monotonic() - replaced_at < 2):
        # Every request gets its answer: one that reaches the dead replica is sent again by the ingress.
        reply = client.completions.create(model="tiny", prompt="still there?", max_tokens=4, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 4
        answered += 1
        now = engine_replicas()
        if replaced_at is None and victim not in now and len(now) == 2 and all(now.values()):
            replaced_at = time.monotonic()
    assert replaced_at is not None, "Serve did not replace the replica whose engine process died"
    assert answered >= 2
    while time.monotonic() < deadline and serve.status().applications["raygrid"].deployments["EngineServer"].status != "HEALTHY":
        time.sleep(0.5)
    status = serve.status().applications["raygrid"].deployments["EngineServer"]
    assert status.status == "HEALTHY" and status.replica_states.get("RUNNING") == 2


def test_hung_engine_process_is_killed_its_streams_migrate_and_the_replica_is_replaced(app, tokenizer):
    """16 streams in flight when an engine process is SIGSTOPped: its replica's client hears no step for
    step_timeout_s (10 s here), kills it and fails its requests as a lost engine, so they migrate to the other
    replica and end as an undisturbed run; Serve replaces the replica. Before, they waited forever."""
    from tests.test_migration import stream_all

    client = openai.OpenAI(base_url=f"{app}/v1", api_key="unused", max_retries=0, timeout=120)
    prompts = random_prompts(16, len(tokenizer), seed=67)
    expected = stream_all(client, prompts)
    before = engine_replicas()
    assert len(before) == 2 and all(len(pids) == 1 for pids in before.values()), before
    stop_a_busy_engine, stopped = busy_engine_fault(before, signal.SIGSTOP)
    try:
        start = time.monotonic()
        assert stream_all(client, prompts, [(32, stop_a_busy_engine)]) == expected
        assert time.monotonic() - start > 10  # the stopped replica's streams waited out the step timeout
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and os.path.exists(f"/proc/{stopped['pid']}"):
            time.sleep(0.5)
        assert not os.path.exists(f"/proc/{stopped['pid']}"), "the hung engine process was not killed"
        while time.monotonic() < deadline:
            now = engine_replicas()
            if stopped["replica"] not in now and len(now) == 2 and all(now.values()):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("Serve did not replace the replica whose engine process hung")
        reply = client.completions.create(model="tiny", prompt="still there?", max_tokens=4, extra_body={"ignore_eos": True})
        assert reply.usage.completion_tokens == 4
    finally:
        if "pid" in stopped and os.path.exists(f"/proc/{stopped['pid']}"):
            os.kill(stopped["pid"], signal.SIGKILL)


def test_serve_config_and_cli_mapping(qwen3_dir, ray_cluster):
    """`raygrid serve --ray-serve`'s flags map onto ServeArgs; bad fields are refused with the field named, and a
    layout the cluster cannot hold fails build_app at once (the config files: tests/test_deploy_configs.py)."""
    args = build_parser().parse_args(["serve", qwen3_dir, "--ray-serve", "-dp", "3", "-tp", "2", "--api-key", "k",
                                      "--tool-call-parser", "hermes", "--max-model-len", "128"])
    serve_args = serve_args_from_cli(args, engine_kwargs(args))
    llm_config = serve_args.llm_configs[0]
    assert llm_config.engine_kwargs == {"max_model_len": 128, "tensor_parallel_size": 2}
    assert llm_config.deployment_config == {"num_replicas": 3}
    assert serve_args.server.api_key == "k" and serve_args.server.tool_call_parser == "hermes"
    bad = build_parser().parse_args(["serve", qwen3_dir, "--ray-serve", "--api-server-count", "2"])
    with pytest.raises(ValueError, match="--api-server-count: not available with --ray-serve"):
        serve_args_from_cli(bad, engine_kwargs(bad))

    base = {"model_loading_config": {"model_id": "m", "model_source": qwen3_dir}}
    for engine_kwargs_, message in (({"max_model_lenn": 5}, "engine_kwargs.max_model_lenn: not an engine argument"),
                                    ({"data_parallel_size": 2}, "engine_kwargs.data_parallel_size: not set under Serve")):
        with pytest.raises(ValueError, match=re.escape(message)):
            ServeArgs.model_validate({"llm_config": {**base, "engine_kwargs": engine_kwargs_}})
    with pytest.raises(ValueError, match=r"1 replica\(s\) of tensor_parallel_size=64 x pipeline_parallel_size=1 need 64 CPU; the cluster has"):
        build_app({"llm_config": {**base, "engine_kwargs": {"device": "cpu", "tensor_parallel_size": 64}}})


def one_process_texts(model_dir: str, prompts: list[list[int]]) -> list[str]:
    """Greedy texts of 8 tokens for ``prompts``, from the engine in this process."""
    llm = LLM(model=model_dir, device="cpu", dtype="float32", max_model_len=256)
    try:
        return [o.outputs[0].text for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                                        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)]
    finally:
        llm.shutdown()


def test_tp2_replica_in_its_placement_group_and_replaced_after_a_worker_dies(app, qwen3_dir, tokenizer):
    """An engine replica of TP=2 (gloo on CPU): its two workers run in the replica's placement group, its greedy
    tokens equal one process's, and SIGKILL on one worker makes the health check fail and Serve replace it."""
    serve.run(build_app({"llm_config": {"model_loading_config": {"model_id": "tiny-tp2", "model_source": qwen3_dir},
                                        "engine_kwargs": {"device": "cpu", "dtype": "float32", "max_model_len": 256,
                                                          "tensor_parallel_size": 2},
                                        "deployment_config": {"num_replicas": 1, "health_check_period_s": 1.0}}}),
              name="raygrid-tp2", route_prefix="/tp2")
    try:
        client = openai.OpenAI(base_url=f"{app}/tp2/v1", api_key="unused", max_retries=0, timeout=60)
        prompts = random_prompts(3, len(tokenizer), seed=64)
        expected = one_process_texts(qwen3_dir, prompts)
        got = [client.completions.create(model="tiny-tp2", prompt=p, max_tokens=8, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text for p in prompts]
        assert got == expected
        table = processes()
        (replica,) = [pid for pid, _, cmd in table if cmd.startswith(b"ray::ServeReplica:raygrid-tp2:EngineServer")]
        workers = [pid for pid, _, cmd in table if cmd.startswith(b"ray::WorkerActor")]  # only this app has workers
        assert len(workers) == 2
        groups = [g for g in placement_group_table().values() if g["state"] == "CREATED"]
        assert any(g["strategy"] == "STRICT_PACK" and list(g["bundles"].values()) == [{"CPU": 1.0}] * 3 for g in groups), \
            "the replica's placement group: its own bundle and one a worker"
        os.kill(workers[0], signal.SIGKILL)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            now = [pid for pid, _, cmd in processes() if cmd.startswith(b"ray::ServeReplica:raygrid-tp2:EngineServer")]
            if now and now != [replica] and serve.status().applications["raygrid-tp2"].status == "RUNNING":
                break
            time.sleep(1)
        assert now and now != [replica], "Serve did not replace the TP=2 replica whose worker died"
        reply = client.completions.create(model="tiny-tp2", prompt=prompts[0], max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert reply.choices[0].text == expected[0]
    finally:
        serve.delete("raygrid-tp2")


def test_expert_parallel_world_is_one_serve_replica(app, qwen3_moe_dir, tokenizer):
    """EP over DP=2 under Serve: one replica holds the world's two workers in its placement group (and the
    CLI maps -dp 2 --enable-expert-parallel to that, not to two replicas); its greedy tokens equal one process's."""
    args = build_parser().parse_args(["serve", "--ray-serve", "--model", qwen3_moe_dir, "-dp", "2", "--enable-expert-parallel"])
    (mapped,) = serve_args_from_cli(args, engine_kwargs(args)).llm_configs
    assert mapped.deployment_config == {"num_replicas": 1} and mapped.engine_kwargs["data_parallel_size"] == 2
    with pytest.raises(ValueError, match=r"engine_kwargs.data_parallel_size: not set under Serve"):
        build_app({"llm_config": {"model_loading_config": {"model_id": "x", "model_source": qwen3_moe_dir},
                                  "engine_kwargs": {"data_parallel_size": 2}}})
    serve.run(build_app({"llm_config": {"model_loading_config": {"model_id": "tiny-ep2", "model_source": qwen3_moe_dir},
                                        "engine_kwargs": {"device": "cpu", "dtype": "float32", "max_model_len": 256,
                                                          "data_parallel_size": 2, "enable_expert_parallel": True}}}),
              name="raygrid-ep2", route_prefix="/ep2")
    try:
        client = openai.OpenAI(base_url=f"{app}/ep2/v1", api_key="unused", max_retries=0, timeout=60)
        prompts = random_prompts(4, len(tokenizer), seed=65)
        expected = one_process_texts(qwen3_moe_dir, prompts)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # together, so that both DP ranks get requests
            got = list(pool.map(lambda p: client.completions.create(model="tiny-ep2", prompt=p, max_tokens=8, temperature=0,
                                                                     extra_body={"ignore_eos": True}).choices[0].text, prompts))
        assert got == expected
        replicas = [pid for pid, _, cmd in processes() if cmd.startswith(b"ray::ServeReplica:raygrid-ep2:EngineServer")]
        workers = [pid for pid, _, cmd in processes() if cmd.startswith(b"ray::WorkerActor")]
        assert len(replicas) == 1 and len(workers) == 2
        groups = [g for g in placement_group_table().values() if g["state"] == "CREATED"]
        assert any(list(g["bundles"].values()) == [{"CPU": 1.0}] * 3 for g in groups), "the world's placement group"
    finally:
        serve.delete("raygrid-ep2")
