"""Distributed execution on a real local Ray cluster with gloo process groups (CPU): tensor, pipeline
and data parallelism give the same greedy tokens as one process, and the same outputs for every sampling
parameter with and without the compiled graph and async scheduling; without migration (max_migrations=0) a
killed or hung worker fails its replica's requests fast (tests/test_migration.py: with it)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import pytest
import ray

from raygrid import LLM, SamplingParams
from raygrid.bench.parallel_check import worker_reports
from tests.conftest import free_cpus_once_settled, random_prompts
from tests.test_execution_modes import params_per_prompt

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("ray_cluster")  # the session's (conftest.py)


@pytest.fixture(scope="module")
def references(model_dirs, tokenizer):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(8, len(tokenizer), seed=21)]
    expected = {}
    for name, path in model_dirs.items():
        llm = LLM(model=path, device="cpu", dtype="float32", max_model_len=256)
        expected[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    return prompts, expected


def run_distributed(path, prompts, **parallel):
    llm = LLM(model=path, device="cpu", dtype="float32", max_model_len=256, **parallel)
    try:
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        return llm, outputs, llm.engine.step_timing()
    finally:
        llm.shutdown()


# Llama's checkpoint under TP=2 and PP=2. The other layouts are elsewhere, to keep the suite's time: Qwen3 under
# TP=2 and PP=2 in the every-sampling-parameter test below, TP=2 x PP=2 in tests/test_multinode.py (Qwen3, over
# two nodes), TP=4 x PP=2 with dummy weights (Llama) and PP=3 below; each against one process.
@pytest.mark.parametrize("parallel", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)], ids=["tp2", "pp2"])
def test_parallel_greedy_matches_single_process(model_dirs, references, parallel):
    prompts, expected = references
    model = "llama"
    _, outputs, timing = run_distributed(model_dirs[model], prompts, **parallel)
    assert [o.outputs[0].token_ids for o in outputs] == expected[model]
    assert all(o.error is None for o in outputs)
    if parallel.get("pipeline_parallel_size", 1) > 1:
        assert timing[0]["max_batches_in_flight"] == 2, "pipeline stages should each have a batch"


def outputs_agree(got, expected, logprob_tol: float = 1e-4) -> None:
    """Same tokens, finish and stop reasons; the same top logprob tokens, values within ``logprob_tol`` (the
    ranks' partial sums meet in a different order than one process adds them)."""
    for g, e in zip(got, expected, strict=True):
        assert (g.prompt_logprobs is None) == (e.prompt_logprobs is None)
        for gs, es in zip(g.prompt_logprobs or [], e.prompt_logprobs or [], strict=True):
            assert (gs is None) == (es is None) and (gs is None or gs.keys() == es.keys())
            assert gs is None or all(abs(gs[t].logprob - es[t].logprob) < logprob_tol for t in gs)
        for gc_, ec in zip(g.outputs, e.outputs, strict=True):
            assert (gc_.token_ids, gc_.finish_reason, gc_.stop_reason) == (ec.token_ids, ec.finish_reason, ec.stop_reason)
            assert (gc_.logprobs is None) == (ec.logprobs is None)
            for gs, es in zip(gc_.logprobs or [], ec.logprobs or [], strict=True):
                assert gs.keys() == es.keys()
                assert all(abs(gs[t].logprob - es[t].logprob) < logprob_tol for t in gs)


def every_parameter_in_one_process(path: str, tokenizer):
    """12 prompts, a request per sampling feature (tests/test_execution_modes.py) and what one process gives them."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=31)]
    single = LLM(model=path, device="cpu", dtype="float32", max_model_len=256, max_num_batched_tokens=64)
    try:
        stop = single.generate(prompts[3], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0].outputs[0].token_ids[2]
        params = params_per_prompt(stop)
        return prompts, params, single.generate(prompts, params, use_tqdm=False)
    finally:
        single.shutdown()


def test_every_sampling_parameter_matches_one_process_in_every_execution_mode(model_dirs, tokenizer):
    """Penalties, min_tokens, stop tokens, seeded top-k/top-p/min-p sampling, n=2 and logprobs, one request
    each, under TP=2 through the compiled graph with async scheduling (the GPU default: the workers pipeline
    their steps) and the custom all-reduce (its kernels in Triton's interpreter), TP=2 through plain actor
    calls with and without async scheduling, and PP=2 through the compiled graph: each gives what one process
    gives. (Requests finish together here, which once left the ranks' batches in different row orders: each
    worker iterated the finished ids as a set, in its own process's hash order.) The replica's driver starts
    without loading torch, seconds sooner (the tokenizer that the grammar request needs brings it later)."""
    path = model_dirs["qwen3"]
    prompts, params, expected = every_parameter_in_one_process(path, tokenizer)
    modes = {
        "tp2-compiled-async": dict(tensor_parallel_size=2, compiled_graph=True, async_scheduling=True, custom_all_reduce=True),
        "tp2-actor-calls": dict(tensor_parallel_size=2, compiled_graph=False),
        "tp2-actor-calls-async": dict(tensor_parallel_size=2, compiled_graph=False, async_scheduling=True),
        "pp2-compiled": dict(pipeline_parallel_size=2, compiled_graph=True),
    }
    for name, mode in modes.items():
        llm = LLM(model=path, device="cpu", dtype="float32", max_model_len=256, max_num_batched_tokens=64, **mode)
        try:
            driver_libraries = loaded_libraries(driver_pid(llm))
            outputs = llm.generate(prompts, params, use_tqdm=False)
            in_flight = llm.engine.step_timing()[0]["max_batches_in_flight"]
            custom = [d["custom_all_reduce"] for d in worker_reports(llm, "device_report")[0]]
        finally:
            llm.shutdown()
        assert all(o.error is None for o in outputs), name
        outputs_agree(outputs, expected)
        assert in_flight == (1 if name == "tp2-actor-calls" else 2), f"{name}: {in_flight} batches in flight"
        assert not [lib for lib in driver_libraries if "libtorch" in lib], f"{name}: the driver started with torch"
        if mode.get("custom_all_reduce"):
            assert custom == [{"enabled": True, "reason": ""}] * 2, custom


def test_async_scheduling_with_pipeline_stages_is_a_clear_error(model_dirs):
    with pytest.raises(ValueError, match=r"async_scheduling needs pipeline_parallel_size 1 \(got 2\)"):
        LLM(model=model_dirs["qwen3"], device="cpu", max_model_len=256, pipeline_parallel_size=2, async_scheduling=True)


def test_tp4_x_pp2_on_eight_ranks_replicates_kv_heads_and_dummy_weights_are_the_same_model(model_dirs, references):
    """Eight ranks, TP=4 x PP=2 (the 70B layout of issue #20, on CPU over gloo): TP=4 over the Llama
    checkpoint's 2 kv heads, so each kv head lives on two ranks of a stage, and the 3 layers split over two
    stages. With load_format="dummy", each checkpoint tensor is drawn from its own name's generator and loaded
    through the model's loaders, so the eight ranks hold shards (and replicated kv heads) of the very weights one
    process holds: greedy tokens agree, and differ from the checkpoint's, which dummy loading never reads."""
    prompts, expected = references
    single = LLM(model=model_dirs["llama"], device="cpu", dtype="float32", max_model_len=256, load_format="dummy")
    try:
        dummy = [o.outputs[0].token_ids for o in single.generate(prompts, GREEDY, use_tqdm=False)]
    finally:
        single.shutdown()
    _, outputs, timing = run_distributed(model_dirs["llama"], prompts, tensor_parallel_size=4, pipeline_parallel_size=2,
                                         load_format="dummy")
    assert [o.outputs[0].token_ids for o in outputs] == dummy
    assert timing[0]["max_batches_in_flight"] == 2, "each pipeline stage should have had a batch"
    assert dummy != expected["llama"]


def test_qwen3_moe_under_tp2_matches_transformers(qwen3_moe_dir, tokenizer):
    """Each rank holds every expert with half of each expert's intermediate dimension; the partial
    outputs meet in one all-reduce. Greedy tokens equal transformers' own."""
    from tests.conftest import hf_greedy

    prompts = random_prompts(4, len(tokenizer), seed=23)
    _, outputs, _ = run_distributed(qwen3_moe_dir, [{"prompt_token_ids": p} for p in prompts], tensor_parallel_size=2)
    assert [o.outputs[0].token_ids for o in outputs] == hf_greedy(qwen3_moe_dir, prompts, GREEDY.max_tokens)


def test_pp3_under_preemption_matches_single_process(model_dirs, tokenizer):
    """Three stages keep three batches in flight while a small pool forces preemptions, so requests are
    preempted with batches of theirs still running; outputs of such batches are dropped (the scheduler
    test drives the re-admission case step by step) and the tokens equal one process's."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(16, len(tokenizer), seed=21)]
    expected = LLM(model=model_dirs["llama"], device="cpu", dtype="float32", max_model_len=128).generate(prompts, GREEDY, use_tqdm=False)
    llm = LLM(model=model_dirs["llama"], device="cpu", dtype="float32", max_model_len=128, pipeline_parallel_size=3,
              num_kv_blocks=29, block_size=8, max_num_batched_tokens=64)
    try:
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        assert llm.get_stats().num_preemptions > 0, "the pool was meant to force preemptions"
        assert llm.engine.step_timing()[0]["max_batches_in_flight"] == 3
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [o.outputs[0].token_ids for o in expected]


def test_cluster_too_small_is_a_clear_error(model_dirs):
    with pytest.raises(ValueError, match=r"need 32 CPU; the cluster has 1 node\(s\) with 16 CPU"):
        LLM(model=model_dirs["qwen3"], device="cpu", tensor_parallel_size=32, max_model_len=256)


def driver_pid(llm, replica: int = 0) -> int:
    return ray.get(llm.engine.replicas[replica].driver.pid.remote())


def loaded_libraries(pid: int) -> set[str]:
    """The shared objects mapped into a live process (Linux)."""
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[-1] for line in maps if line.rstrip().endswith(".so") or ".so." in line}


def worker_pid(llm, replica: int, rank: int) -> int:
    return ray.get(ray.get_actor(llm.engine.worker_names(replica)[rank]).pid.remote())


def resume(pid: int) -> None:
    """SIGCONT a process a test stopped, if it is still there (its replica's release may have killed it)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def actor_gone(name: str, timeout: float = 10.0) -> bool:
    """Is the named actor gone (within ``timeout``: its name outlives the kill for a moment)?"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            return True
        time.sleep(0.1)
    return False


def placement_groups_alive() -> int:
    return sum(1 for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED")


def fill_the_cluster() -> dict:
    """Two workers that take every free CPU of the test cluster: a replica whose reservation leaked would leave no
    room for the next one (its placement would time out)."""
    return dict(tensor_parallel_size=2, ray_worker_cpus=free_cpus_once_settled() / 2)


def test_killed_worker_fails_requests_fast_and_frees_its_resources(model_dirs, tokenizer):
    """Without migration (max_migrations=0, the behaviour before it): a killed worker fails its replica's requests
    at once, naming the rank, and the replica's reservations are released, so that its rebuild fits in the
    full cluster and serves later requests; then `del llm` releases everything. Through the compiled graph; plain
    actor calls meet a killed worker in tests/test_migration.py, where the requests migrate (and fail past
    max_migrations)."""
    llm = LLM(model=model_dirs["qwen3"], device="cpu", dtype="float32", max_model_len=1024, compiled_graph=True,
              max_migrations=0, **fill_the_cluster())
    try:
        pid = worker_pid(llm, 0, 1)
        prompts = [{"prompt_token_ids": p} for p in random_prompts(4, len(tokenizer), seed=3)]
        killer = threading.Timer(1.5, lambda: os.kill(pid, signal.SIGKILL))  # kill -9 of a real worker process
        killer.start()
        start = time.monotonic()
        outputs = llm.generate(prompts, SamplingParams(max_tokens=900, ignore_eos=True), use_tqdm=False)
        elapsed = time.monotonic() - start
        killer.join()
        assert elapsed < 60, f"generate took {elapsed:.1f}s after the worker died"
        assert all(o.error and "failed" in o.error for o in outputs)
        assert all("rank 1" in o.error for o in outputs), outputs[0].error
        assert all(len(o.outputs[0].token_ids) < 900 for o in outputs)
        assert llm.engine.healthy == [False]
        # A later request waits for the rebuild, which fits only if the dead replica's reservations were freed.
        (late,) = llm.generate("after the crash", SamplingParams(max_tokens=4), use_tqdm=False)
        assert late.error is None and llm.engine.healthy == [True] and llm.get_stats().replica_rebuilds == 1
        assert placement_groups_alive() == 1, "one placement group: the rebuilt replica's (its one stage)"
        names = llm.engine.worker_names()
    except BaseException:
        llm.shutdown()
        raise
    # As notebooks and test suites use vLLM: `del llm` (no shutdown()) leaves no placement group and no actor
    # behind, the rebuilt replica's included.
    del llm
    gc.collect()
    assert placement_groups_alive() == 0
    assert all(actor_gone(name) for name in names)


def test_failed_construction_releases_everything_on_ray(model_dirs):
    """An LLM whose construction fails (a KV pool too small, found by the replica) leaves no placement group
    behind. (`del llm` on a working engine: at the end of test_killed_worker_fails_requests_fast_and_frees_its_resources.)"""
    with pytest.raises(Exception, match="the KV pool has 2 blocks"):
        LLM(model=model_dirs["qwen3"], device="cpu", dtype="float32", max_model_len=256, num_kv_blocks=2, **fill_the_cluster())
    assert placement_groups_alive() == 0


def test_data_parallel_splits_the_batch_and_a_hung_worker_fails_its_replica_while_the_other_serves(
        model_dirs, tokenizer, references):
    """DP=2: the batch is split over both replicas, and greedy tokens equal one process's. Then SIGSTOP one worker
    (a real hang) while its replica has requests: without migration (max_migrations=0) they fail within
    step_timeout_s, naming the rank, and the other data-parallel replica keeps serving meanwhile. (Through the
    compiled graph, a hang is caught in tests/test_migration.py, where the requests migrate.)"""
    llm = LLM(model=model_dirs["qwen3"], device="cpu", dtype="float32", max_model_len=1024, data_parallel_size=2,
              step_timeout_s=3.0, max_migrations=0)
    pid = worker_pid(llm, 0, 0)
    try:
        ref_prompts, expected = references
        assert [o.outputs[0].token_ids for o in llm.generate(ref_prompts, GREEDY, use_tqdm=False)] == expected["qwen3"]
        timing = llm.engine.step_timing()
        assert len(timing) == 2 and all(t["num_steps"] > 0 for t in timing), "both replicas should have served requests"
        prompts = [{"prompt_token_ids": p} for p in random_prompts(8, len(tokenizer), seed=4)]
        params = SamplingParams(max_tokens=120, ignore_eos=True, temperature=0)
        # The replica's first step starts at once, so the worker is stopped before it; a timer would race
        # with a replica that finishes the whole batch in under a second.
        os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.monotonic() - start
        failed = [o for o in outputs if o.error]
        served = [o for o in outputs if not o.error]
        assert failed and served, "one replica should have failed and the other served"
        assert all("rank(s) [0]" in o.error and "step_timeout_s" in o.error for o in failed), failed[0].error
        assert all(len(o.outputs[0].token_ids) == 120 for o in served)
        assert elapsed < 60
        assert llm.get_stats().request_migrations == 0
        (late,) = llm.generate("still serving", SamplingParams(max_tokens=4), use_tqdm=False)
        assert late.error is None
    finally:
        resume(pid)
        llm.shutdown()


def test_async_front_end_on_ray(model_dirs, references):
    """The serving front end (AsyncLLM) over a tensor-parallel replica on Ray."""
    import asyncio

    from raygrid.engine.async_llm import AsyncLLM

    prompts, expected = references
    engine = AsyncLLM(model_dirs["qwen3"], device="cpu", dtype="float32", max_model_len=256, **fill_the_cluster())

    async def run():
        async def one(prompt):
            ids = []
            async for out in engine.generate(prompt, GREEDY, delta=True):
                ids += out.outputs[0].token_ids
            return ids

        return await asyncio.gather(*(one(p) for p in prompts[:4]))

    assert asyncio.run(run()) == expected["qwen3"][:4]
    assert b"raygrid_generation_tokens_total" in engine.render_metrics()
    # Dropped without shutdown(): its engine thread ends and garbage collection frees the actors and
    # placement groups.
    thread, names = engine._thread, engine.engine.worker_names()
    del engine
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive() and placement_groups_alive() == 0
    assert all(actor_gone(name) for name in names)
