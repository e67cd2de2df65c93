"""Expert parallelism and EPLB on CPU: local Ray, gloo, the tiny random Qwen3-MoE (8 experts, top-2) against
transformers and against one process, for every sampling parameter; rebalancing in the middle of generation;
a skewed router."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from raygrid import LLM, SamplingParams
from raygrid.engine.metrics import EngineMetrics
from raygrid.parallel.eplb import initial_map
from tests.conftest import hf_greedy, random_prompts
from tests.test_distributed import every_parameter_in_one_process, outputs_agree, worker_pid

pytestmark = pytest.mark.usefixtures("ray_cluster")  # the session's (conftest.py)

MAX_NEW = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
SPARSE_LAYERS = (0, 2)  # the tiny checkpoint's layer 1 is dense


@pytest.fixture(scope="module")
def case(qwen3_moe_dir, tokenizer):
    prompts = random_prompts(8, len(tokenizer), seed=41)
    return [{"prompt_token_ids": p} for p in prompts], hf_greedy(qwen3_moe_dir, prompts, MAX_NEW)


def moe_llm(path, **kwargs):
    return LLM(model=path, device="cpu", dtype="float32", max_model_len=256, max_num_batched_tokens=64,
               enable_expert_parallel=True, **kwargs)


def check_greedy(llm, case):
    """All prompts, then one alone (the other DP ranks idle, running dummy passes): transformers' tokens."""
    prompts, expected = case
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert got == expected
    (alone,) = llm.generate(prompts[5], GREEDY, use_tqdm=False)
    assert alone.outputs[0].token_ids == expected[5]


def test_ep_over_two_dp_ranks_matches_transformers_and_one_process_for_every_sampling_parameter(qwen3_moe_dir, tokenizer, case):
    """EP=2 (DP=2 attention) in two pipeline stages (each stage's EP group its own) through actor calls, and in
    one stage through the compiled graph with async scheduling (the workers pipeline their steps) and EPLB
    rebalancing every 4 steps onto 2 redundant slots: greedy tokens are transformers', and every sampling
    parameter gives what one process gives."""
    prompts, params, expected = every_parameter_in_one_process(qwen3_moe_dir, tokenizer)
    modes = {
        "actor-calls-pp2": dict(data_parallel_size=2, pipeline_parallel_size=2, compiled_graph=False),
        "compiled-async-eplb": dict(data_parallel_size=2, compiled_graph=True, async_scheduling=True, enable_eplb=True,
                                    eplb_config=dict(num_redundant_experts=2, step_interval=4, window_size=8)),
    }
    for name, mode in modes.items():
        llm = moe_llm(qwen3_moe_dir, **mode)
        try:
            check_greedy(llm, case)
            outputs = llm.generate(prompts, params, use_tqdm=False)
            stats, timing = llm.get_stats(), llm.engine.step_timing()
            transports = llm.engine.transports()
        finally:
            llm.shutdown()
        assert all(o.error is None for o in outputs), name
        outputs_agree(outputs, expected, logprob_tol=1e-3)
        assert transports == ["actor calls" if name.startswith("actor") else "compiled graph"], transports
        if "async" in name:
            assert timing[0]["max_batches_in_flight"] == 2, f"{name}: the steps did not overlap"
        if "eplb" in name:
            assert stats.eplb_rebalances >= 5, f"{name}: {stats.eplb_rebalances} rebalances"


def checkpoint_experts(path: str) -> dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, expert) -> (w13, w2) as the checkpoint holds them."""
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        t = {name: f.get_tensor(name) for name in f.keys()}
    out = {}
    for layer in SPARSE_LAYERS:
        for e in range(8):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            out[layer, e] = (torch.cat([t[f"{p}.gate_proj.weight"], t[f"{p}.up_proj.weight"]]), t[f"{p}.down_proj.weight"])
    return out


def test_ep8_over_dp4_tp2_rebalances_mid_generation_and_moved_weights_equal_the_originals(qwen3_moe_dir, case):
    """EP=8 (DP=4 x TP=2: eight ranks, issue #20's EP=8 on CPU over gloo) with 8 redundant slots (2 a rank),
    rebalancing every 5 steps: greedy tokens before and after each rebalance are transformers', every slot holds
    its expert's original weights, and experts did move between ranks. Then a worker dies, and the world fails
    as one replica."""
    llm = moe_llm(qwen3_moe_dir, data_parallel_size=4, tensor_parallel_size=2, enable_eplb=True, max_migrations=0,
                  eplb_config=dict(num_redundant_experts=8, step_interval=5, window_size=10))
    try:
        check_greedy(llm, case)
        stats = llm.get_stats()
        (placements,) = llm.engine.collective_rpc("expert_placement")
        (reports,) = llm.engine.collective_rpc("eplb_reports")
        # The world is one replica: one worker killed (SIGKILL, DP rank 1's second TP rank) fails every request of
        # every DP rank (none migrates: max_migrations=0), and the world is rebuilt.
        pid = worker_pid(llm, 0, 3)
        threading.Timer(1.0, lambda: os.kill(pid, signal.SIGKILL)).start()
        outputs = llm.generate(case[0], SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
        assert all(o.error and "failed" in o.error for o in outputs), [o.error for o in outputs]
        assert llm.engine.healthy == [False]
    finally:
        llm.shutdown()
    assert stats.eplb_rebalances >= 3 and len({len(r) for r in reports}) == 1  # every rank rebalanced together
    assert sum(r["moved_experts"] for r in reports[0]) > 0
    originals = checkpoint_experts(qwen3_moe_dir)
    for layer_index, layer in enumerate(SPARSE_LAYERS):
        world_map = [expert for rank in placements for expert, _, _ in rank[layer_index]]
        assert sorted(set(world_map)) == list(range(8)) and len(world_map) == 16
        assert world_map != initial_map(8, 16).tolist(), "no expert moved"
        for rank in placements:
            for expert, w13, w2 in rank[layer_index]:
                assert torch.equal(w13, originals[layer, expert][0]) and torch.equal(w2, originals[layer, expert][1])


def skewed_checkpoint(source: str, target: Path) -> str:
    """The tiny model with a router bias toward experts 2 and 3: every embedding gets a constant direction v,
    which the residual stream carries into each MoE layer, and the routers' rows 2 and 3 point along v."""
    shutil.copytree(source, target)
    tensors = load_file(str(target / "model.safetensors"))
    hidden = json.loads((target / "config.json").read_text())["hidden_size"]
    v = torch.ones(hidden) / hidden**0.5
    tensors["model.embed_tokens.weight"] += 10.0 * v
    for layer in SPARSE_LAYERS:
        gate = tensors[f"model.layers.{layer}.mlp.gate.weight"]
        gate[2:4] += 100.0 * v
    save_file(tensors, str(target / "model.safetensors"))
    return str(target)


def test_skewed_router_rebalancing_with_redundant_experts_raises_balancedness(qwen3_moe_dir, tokenizer, tmp_path):
    """Experts 2 and 3 take nearly every token, and the starting map puts both on rank 0 of EP=2 (slots 0-4 hold
    experts 0-4, the redundant slots 8 and 9 experts 0 and 1): balancedness about 0.5. EPLB gives each a replica
    on rank 1: measured over the next windows, above 0.9."""
    path = skewed_checkpoint(qwen3_moe_dir, tmp_path / "skewed")
    llm = moe_llm(path, data_parallel_size=2, enable_eplb=True,
                  eplb_config=dict(num_redundant_experts=2, step_interval=8, window_size=8))
    try:
        prompts = [{"prompt_token_ids": p} for p in random_prompts(8, len(tokenizer), seed=43)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
        stats = llm.get_stats()
        (reports,) = llm.engine.collective_rpc("eplb_reports")
    finally:
        llm.shutdown()
    first, later = reports[0][0], reports[0][1:]
    assert first["balancedness_before"] == pytest.approx(0.5, abs=0.05), first
    assert first["balancedness_after"] > 0.9 and first["moved_experts"] > 0, first
    assert later and all(r["balancedness_before"] > 0.9 for r in later), later  # measured on the new placement
    assert stats.expert_balancedness > 0.9 and stats.eplb_rebalances == len(reports[0])
    # /metrics: the API server's exporter reports them.
    metrics = EngineMetrics("skewed")
    metrics.observe_scheduler(stats)
    text = metrics.render().decode()
    assert f'raygrid_expert_balancedness{{model_name="skewed"}} {stats.expert_balancedness}' in text
    assert f'raygrid_eplb_rebalances_total{{model_name="skewed"}} {float(stats.eplb_rebalances)}' in text
