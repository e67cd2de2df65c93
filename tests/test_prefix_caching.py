"""Prefix caching: a second pass over prompts sharing a long prefix reuses cached blocks."""

from __future__ import annotations

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts


def test_shared_prefix_is_cached_and_computed_once(qwen3_dir, tokenizer):
    llm = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512)
    prefix = random_prompts(1, len(tokenizer), min_len=160, max_len=160, seed=11)[0]
    tails = random_prompts(6, len(tokenizer), min_len=5, max_len=30, seed=12)
    prompts = [{"prompt_token_ids": prefix + tail} for tail in tails]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    first = llm.generate(prompts[:1], params, use_tqdm=False)
    computed_first = llm.get_stats().num_scheduled_tokens
    assert first[0].num_cached_tokens == 0

    rest = llm.generate(prompts[1:], params, use_tqdm=False)
    computed_rest = llm.get_stats().num_scheduled_tokens - computed_first
    for out in rest:
        assert out.num_cached_tokens == 160  # ten full blocks of the shared prefix
    # Five requests computed only their tails and outputs, not the 160 shared tokens each.
    assert computed_rest <= sum(len(t) + 8 for t in tails[1:]) + 5 * 16
    stats = llm.get_stats()
    assert stats.prefix_cache_hits >= 5 * 160 and 0 < stats.prefix_cache_hit_rate < 1
    assert stats.num_free_blocks == stats.num_total_blocks

    # Cached or not, the tokens are the same.
    uncached = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512, enable_prefix_caching=False)
    expected = uncached.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + rest] == [o.outputs[0].token_ids for o in expected]
    assert all(o.num_cached_tokens == 0 for o in expected)


def test_cache_salts_isolate_requests(qwen3_dir, tokenizer):
    """vLLM's cache_salt: prompts with different salts share no block; the same salt shares as usual."""
    llm = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=512, prefix_caching_hash_seed="fixed")
    tokens = random_prompts(1, len(tokenizer), min_len=70, max_len=70, seed=13)[0]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    def cached(**salt) -> int:
        return llm.generate({"prompt_token_ids": tokens, **salt}, params, use_tqdm=False)[0].num_cached_tokens

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-b") == 0  # same tokens, other salt: nothing shared
    assert cached() == 0  # no salt is a salt of its own
    assert cached(cache_salt="tenant-a") == 64 and cached(cache_salt="tenant-b") == 64 and cached() == 64
    bad = llm.generate({"prompt_token_ids": tokens, "cache_salt": ""}, params, use_tqdm=False)[0]
    assert bad.error and "cache_salt" in bad.error
