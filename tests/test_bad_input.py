"""Bad input gets an error naming the field and the limit; the rest of the batch still completes."""

from __future__ import annotations

import numpy as np
import pytest

from raygrid import LLM, SamplingParams
from raygrid.validation import InvalidArgument
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    return LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=64, max_logprobs=5)


@pytest.mark.parametrize(
    "kwargs, line",
    [
        (dict(temperature=-0.5), "temperature: must be >= 0.0 (got -0.5)"),
        (dict(top_p=0.0), "top_p: must be > 0.0 (got 0.0)"),
        (dict(top_p=1.5), "top_p: must be <= 1.0 (got 1.5)"),
        (dict(top_k=-2), "top_k: must be >= -1 (got -2)"),
        (dict(min_p=2.0), "min_p: must be <= 1.0 (got 2.0)"),
        (dict(n=0), "n: must be >= 1 (got 0)"),
        (dict(max_tokens=0), "max_tokens: must be >= 1 (got 0)"),
        (dict(max_tokens=-3), "max_tokens: must be >= 1 (got -3)"),
        (dict(presence_penalty=3.0), "presence_penalty: must be <= 2.0 (got 3.0)"),
        (dict(frequency_penalty=-2.5), "frequency_penalty: must be >= -2.0 (got -2.5)"),
        (dict(repetition_penalty=0.0), "repetition_penalty: must be > 0.0 (got 0.0)"),
        (dict(seed=2**63), f"seed: must be < {2**63} (got {2**63})"),  # int64, as in vLLM: negative seeds are fine
        (dict(logprobs=-1), "logprobs: must be >= 0 (got -1)"),
        (dict(stop=[""]), "stop strings must not be empty"),
        (dict(stop_token_ids=[-4]), "stop_token_ids must be >= 0"),
        (dict(bad_words_token_ids=[[5], []]), "bad_words_token_ids must not hold empty sequences"),  # the step raised on it
        (dict(bad_words_token_ids=[[5, -1]]), "bad_words_token_ids must be >= 0"),
        (dict(min_tokens=10, max_tokens=5), "min_tokens (10) must be <= max_tokens (5)"),
        (dict(temperature="hot"), "temperature: input should be a valid number, unable to parse string as a number (got 'hot')"),
        (dict(unknown_field=1), "unknown_field: is not an argument raygrid knows"),
        (dict(top_k=-2, n=0), "n: must be >= 1 (got 0); top_k: must be >= -1 (got -2)"),
    ],
)
def test_invalid_sampling_params_raise_one_line_naming_the_field_and_limit(kwargs, line):
    with pytest.raises(InvalidArgument) as info:
        SamplingParams(**kwargs)
    assert str(info.value) == line
    assert isinstance(info.value, ValueError)


def test_bad_requests_fail_alone(llm, tokenizer):
    good = [{"prompt_token_ids": p} for p in random_prompts(3, len(tokenizer), max_len=20, seed=9)]
    vocab = len(tokenizer)
    prompts = [
        good[0],
        {"prompt_token_ids": list(range(3, 3 + 64))},  # too long for max_model_len 64
        {"prompt_token_ids": []},  # empty
        good[1],
        {"prompt_token_ids": [5, vocab + 10, 7]},  # out of vocabulary
        {"prompt_token_ids": [5, -1, 7]},  # negative id
        "",  # empty text
        {"text": "wrong key"},  # malformed prompt
        good[2],
        good[0],
        {"prompt_token_ids": [5, 6], "multi_modal_data": {}},  # a key raygrid does not take: refused, not dropped
        good[1],
        {"prompt_token_ids": np.array(good[2]["prompt_token_ids"])},  # a NumPy array of ids: taken as the list
        {"prompt_token_ids": [5, 2.5, 7, np.int64(vocab)]},  # not an integer, and a NumPy integer past the vocabulary
    ]
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)] * len(prompts)
    params[9] = SamplingParams(max_tokens=8, logprobs=6)  # above max_logprobs
    params[11] = SamplingParams(max_tokens=8, bad_words_token_ids=[[5, vocab]])  # out of vocabulary
    outputs = llm.generate(prompts, params, use_tqdm=False)
    errors = [o.error for o in outputs]
    assert errors[0] is None and errors[3] is None and errors[8] is None
    assert "max_model_len (64)" in errors[1]
    assert "empty" in errors[2] and "empty" in errors[6]
    assert f"[0, {vocab})" in errors[4] and f"[0, {vocab})" in errors[5]
    assert "prompt_token_ids" in errors[7]
    assert "max_logprobs (5)" in errors[9]
    assert errors[10] == "a prompt dict takes cache_salt, prompt, prompt_token_ids; it has ['multi_modal_data']"
    assert errors[11] == f"bad_words_token_ids has ids outside [0, {vocab}): [{vocab}]"
    assert errors[12] is None and outputs[12].outputs[0].token_ids == outputs[8].outputs[0].token_ids
    assert outputs[12].prompt_token_ids == good[2]["prompt_token_ids"]
    assert all(type(t) is int for t in outputs[12].prompt_token_ids)
    assert errors[13] == f"prompt_token_ids has ids outside [0, {vocab}): [2.5, {vocab}]"
    for i in (0, 3, 8):
        assert len(outputs[i].outputs[0].token_ids) == 8
    stats = llm.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    # The engine goes on serving afterwards.
    assert llm.generate(good[1], SamplingParams(max_tokens=3), use_tqdm=False)[0].outputs[0].token_ids


def test_arguments_of_the_wrong_type_name_what_was_given(llm):
    for call, message in ((lambda: llm.generate(None), "prompts: a prompt (a string, {'prompt': str} or "
                                                       "{'prompt_token_ids': [int, ...]}) or a list of them, not NoneType"),
                          (lambda: llm.generate("hi", {"max_tokens": 2}), "sampling_params: a SamplingParams or a list of them, not dict"),
                          (lambda: llm.generate(["a", "b"], [SamplingParams(), {"max_tokens": 2}]),
                           "sampling_params: a list of SamplingParams, not of dict"),
                          (lambda: llm.chat("hello"), "messages: a conversation (a list of {'role': ..., 'content': ...} "
                                                      "dicts) or a list of them, not str"),
                          (lambda: llm.chat([[{"role": "user", "content": "hi"}], ["hi"]]),
                           "messages: a conversation (a list of {'role': ..., 'content': ...} dicts) or a list of them, "
                           "not list of list of str")):
        with pytest.raises(TypeError) as info:
            call()
        assert str(info.value) == message


def test_a_priority_under_fcfs_fails_its_request_not_ignored(llm):
    """As vLLM: a priority means nothing to the fcfs policy, so the request fails rather than running unranked."""
    outs = llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=[0, 3], use_tqdm=False)
    assert outs[0].error is None and len(outs[0].outputs[0].token_ids) == 2
    assert outs[1].error == "priority (3) needs the priority scheduling policy (--scheduling-policy priority); this engine schedules fcfs"


def test_max_tokens_is_capped_by_the_context(llm):
    out = llm.generate({"prompt_token_ids": list(range(3, 3 + 60))}, SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 4 and out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(block_size=0), "block_size: must be >= 1 (got 0)"),
        (dict(max_num_seqs=0), "max_num_seqs: must be >= 1 (got 0)"),
        (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization: must be <= 1.0 (got 1.5)"),
        (dict(dtype="float8"), "dtype: input should be 'auto', 'float32', 'bfloat16' or 'float16' (got 'float8')"),
        (dict(kv_cache_dtype="int8"), "kv_cache_dtype: input should be 'auto', 'fp8' or 'fp8_e4m3' (got 'int8')"),
        (dict(scheduling_policy="random"), "scheduling_policy: input should be 'fcfs' or 'priority' (got 'random')"),
        (dict(tensor_parallel_size=0), "tensor_parallel_size: must be >= 1 (got 0)"),
        (dict(eplb_config={"window_size": 0}), "eplb_config.window_size: must be >= 1 (got 0)"),
        (dict(max_model_len=100000), "max_model_len (100000) is larger than the checkpoint's max_position_embeddings"),
        (dict(enable_chunked_prefill=False, max_num_batched_tokens=32, max_model_len=64), "max_num_batched_tokens (32) must be >="),
        (dict(num_kv_blocks=3, max_model_len=64), "the KV pool has 3 blocks of 16 tokens; one request of max_model_len (64) "
         "needs 5 (with the null block): lower max_model_len to at most 32, or raise num_kv_blocks (on a CPU the pool is "
         "1 GiB unless set)"),
        (dict(num_kv_blocks=2**30, max_model_len=64), "num_kv_blocks (1073741824): "),  # terabytes, past any host's memory
    ],
)
def test_bad_engine_arguments_name_the_field_in_one_line(qwen3_dir, kwargs, message):
    with pytest.raises(ValueError) as info:
        LLM(model=qwen3_dir, device="cpu", **kwargs)
    assert str(info.value).startswith(message) if ":" in message else message in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_model_path_and_architecture(tmp_path, qwen3_dir):
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        LLM(model=str(tmp_path / "nowhere"))
    import json
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(qwen3_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    config["architectures"] = ["MambaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="MambaForCausalLM.*not supported"):
        LLM(model=str(bad), device="cpu")


def test_seed_overflow_of_n_children_does_not_break_the_engine(llm, tokenizer):
    """seed 2**63 - 1 with n=2: the second child's seed wraps within int64 (it used to overflow and kill
    the engine, and the next generate() spun forever)."""
    prompt = {"prompt_token_ids": random_prompts(1, len(tokenizer), seed=41)[0]}
    out = llm.generate(prompt, SamplingParams(n=2, seed=2**63 - 1, temperature=1.0, max_tokens=4), use_tqdm=False)[0]
    assert out.error is None and len(out.outputs) == 2
    negative = llm.generate(prompt, SamplingParams(n=2, seed=-(2**63), temperature=1.0, max_tokens=4), use_tqdm=False)[0]
    assert negative.error is None and len(negative.outputs) == 2
    after = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert after.error is None and len(after.outputs[0].token_ids) == 4


def test_a_request_the_worker_cannot_take_fails_alone(llm, tokenizer):
    """Bad input that validation missed (a top_k forced past int64, as the seed overflow once was): the
    worker refuses that request alone, the others in its batch complete, and the engine carries on."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, len(tokenizer), seed=42)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    smuggled = SamplingParams(temperature=1.0, top_k=5, max_tokens=6)
    object.__setattr__(smuggled, "top_k", 2**70)  # past the validator: what a missed check looks like
    outputs = llm.generate(prompts, [smuggled, greedy, greedy], use_tqdm=False)
    assert outputs[0].error and "OverflowError" in outputs[0].error
    assert [o.outputs[0].token_ids for o in outputs[1:]] == expected[1:]
    stats = llm.get_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)] == expected


def test_a_step_that_raises_fails_its_requests_and_the_engine_carries_on(qwen3_dir, tokenizer):
    """A failure no request can be blamed for (here: the KV cache tensors are gone, as after a device
    fault) fails the requests in flight; once the cause is gone, the same engine serves again."""
    llm = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=256, async_scheduling=True)
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, len(tokenizer), seed=43)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    runner = llm.engine.executor.worker.runner
    caches, runner.kv_caches = runner.kv_caches, []
    failed = llm.generate(prompts, greedy, use_tqdm=False)
    assert all(o.error and "the engine step failed" in o.error for o in failed)
    runner.kv_caches = caches
    stats = llm.get_stats()
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)] == expected


def test_bans_that_leave_no_token_fail_their_request_alone(llm, tokenizer):
    """allowed_token_ids with bad_words, min_tokens or a grammar that leave the sampler no token at all. Where that
    holds from the first token, the request is refused at once, naming the fields; where it comes later (a bad word
    of two tokens, a grammar), the request fails when its banned token is drawn, and the error is the request's own
    (``invalid``: a server answers 400). Before, the sampler drew a banned token (id 0) and went on. Bans that leave
    a token are not mistaken for these, and the rest of the batch completes as it does alone."""
    from raygrid.engine.sampling_params import StructuredOutputsParams

    word = tokenizer.decode([77])
    assert [77] in llm.processor.bad_words_token_ids([word]) and [77, 77] in llm.processor.bad_words_token_ids([word * 2])
    eos = tokenizer.eos_token_id
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, len(tokenizer), max_len=20, seed=13)]
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    cases = [  # (params, the error's words or None, the tokens before it)
        (SamplingParams(max_tokens=4, allowed_token_ids=[77], bad_words=[word]),
         "allowed_token_ids: bad_words ban every one of them, so no token is left to sample", []),
        (SamplingParams(max_tokens=4, allowed_token_ids=[eos, 5], bad_words=[tokenizer.decode([5])], min_tokens=2),
         "allowed_token_ids: those that bad_words leave are EOS or stop tokens, which min_tokens (2) bans", []),
        (SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=[77], bad_words=[word * 2]),
         "no token was left to sample at output token 2: allowed_token_ids and bad_words ban every token", [77]),
        (SamplingParams(max_tokens=4, allowed_token_ids=[77], min_tokens=1, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
         "no token was left to sample at output token 1: the grammar allows none of the tokens that allowed_token_ids and "
         "min_tokens leave", []),
        # A grammar complete before min_tokens: only EOS may follow it. Before, it stopped short of min_tokens.
        (SamplingParams(max_tokens=6, temperature=0, min_tokens=3, structured_outputs=StructuredOutputsParams(choice=["x"])),
         "the grammar completed at output token 1, before min_tokens (3): only EOS may follow", []),
        (SamplingParams(max_tokens=6, temperature=0, min_tokens=1, structured_outputs=StructuredOutputsParams(choice=["x"])),
         None, tokenizer.encode("x", add_special_tokens=False)),
        (SamplingParams(max_tokens=4, allowed_token_ids=[77, 78], bad_words=[word], min_tokens=2), None, [78] * 4),
        # EOS is banned for two tokens, then 77 by the bad word: EOS is what is left.
        (SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=[77, eos], min_tokens=2, bad_words=[word * 3]), None,
         [77, 77, eos]),
    ]
    outputs = llm.generate(prompts + [prompts[0]] * len(cases), [greedy] * 3 + [params for params, _, _ in cases], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outputs[:3]] == alone and not any(o.error for o in outputs[:3])
    for output, (params, words, before) in zip(outputs[3:], cases):
        if words is None:
            assert output.error is None and not output.invalid and output.outputs[0].token_ids == before, (params, output)
            continue
        assert output.error.startswith(words) and output.invalid, (params, output.error)
        assert not output.outputs or output.outputs[0].token_ids[:len(before)] == before, output.outputs
    stats = llm.get_stats()
    assert stats.num_running == 0 and stats.num_waiting == 0 and stats.num_free_blocks == stats.num_total_blocks
