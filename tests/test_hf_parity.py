"""Greedy generation matches Hugging Face transformers token for token (float32, CPU), whatever the
batching: chunked prefill, prefix caching on or off, and a KV pool small enough to force preemption."""

from __future__ import annotations

import zlib

import pytest

from raygrid import LLM, SamplingParams
from tests.conftest import hf_greedy, random_prompts

MAX_NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)

ENGINE_VARIANTS = {
    "default": dict(),
    "chunked_prefill_32": dict(max_num_batched_tokens=32),
    "no_prefix_caching": dict(enable_prefix_caching=False, max_num_batched_tokens=48),
    "block_size_8_long_prefill_cap": dict(block_size=8, long_prefill_token_threshold=20),
    # Step N+1 scheduled while step N runs, its inputs partly tokens the host has not seen yet.
    "async_scheduling_chunked": dict(async_scheduling=True, max_num_batched_tokens=40),
}


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def case(request, model_dirs, tokenizer):
    name = request.param
    # The same prompts on every run (str's hash() changes with each interpreter's PYTHONHASHSEED: a failure would
    # not reproduce).
    prompts = random_prompts(10, len(tokenizer), seed=zlib.crc32(name.encode()) % 1000)
    return name, model_dirs[name], prompts, hf_greedy(model_dirs[name], prompts, MAX_NEW_TOKENS)


def run(model_dir, prompts, **engine_kwargs):
    llm = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, **engine_kwargs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("variant", list(ENGINE_VARIANTS))
def test_greedy_matches_transformers(case, variant):
    _, model_dir, prompts, expected = case
    llm, got = run(model_dir, prompts, **ENGINE_VARIANTS[variant])
    assert got == expected
    if ENGINE_VARIANTS[variant].get("async_scheduling"):
        assert llm.engine.step_timing()[0]["max_batches_in_flight"] == 2
    stats = llm.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks, "KV blocks leaked"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_matches_transformers_under_preemption(case, async_scheduling):
    _, model_dir, prompts, expected = case
    # 24 usable blocks of 16 tokens: far less than 10 requests of up to 94 tokens need at once.
    llm, got = run(model_dir, prompts, num_kv_blocks=25, async_scheduling=async_scheduling)
    assert llm.get_stats().num_preemptions > 0, "the pool was meant to be too small to avoid preemption"
    assert got == expected
    stats = llm.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_priority_policy_preempts_and_matches(case):
    _, model_dir, prompts, expected = case
    llm = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=25, scheduling_policy="priority")
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False, priority=list(range(len(prompts)))[::-1])
    assert llm.get_stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outputs] == expected


def test_seeded_sampling_survives_preemption(case):
    """A seeded request's noise depends on the position sampled, so recomputing after a preemption
    draws the same tokens as an engine with room for everything."""
    _, model_dir, prompts, _ = case
    params = [SamplingParams(temperature=1.0, top_p=0.95, seed=100 + i, max_tokens=MAX_NEW_TOKENS, ignore_eos=True) for i in range(len(prompts))]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    roomy = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256)
    tight = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=25)
    expected = [o.outputs[0].token_ids for o in roomy.generate(inputs, params, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in tight.generate(inputs, params, use_tqdm=False)]
    assert tight.get_stats().num_preemptions > 0
    assert got == expected
