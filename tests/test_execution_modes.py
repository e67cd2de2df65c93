"""Async scheduling computes exactly what synchronous scheduling computes, for every sampling parameter,
on both tiny models; greedy with a repetition penalty matches transformers in both modes; and a request
preempted in the very step that granted it tokens resumes to the output of an engine with room to spare.

Under async scheduling step N+1 is prepared while step N's sampled token is still on the device: the
penalty counts, the min_tokens ban and the seeds must all count that token anyway."""

from __future__ import annotations

import random

import pytest

from raygrid import LLM, EngineArgs, LLMEngine, SamplingParams
from raygrid.engine.sampling_params import StructuredOutputsParams
from tests.conftest import hf_greedy, random_prompts

MAX_TOKENS = 20
VOCAB = 1024  # the tiny checkpoints' vocabulary


def make_llm(model_dir, **kwargs):
    return LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, **kwargs)


def params_per_prompt(stop_token: int) -> list[SamplingParams]:
    """One request per sampling feature (and some together); sampled ones are seeded so both modes
    draw the same noise."""
    base = dict(max_tokens=MAX_TOKENS, ignore_eos=True)
    return [
        SamplingParams(temperature=0, repetition_penalty=1.3, **base),
        SamplingParams(temperature=0, presence_penalty=1.5, **base),
        SamplingParams(temperature=0, frequency_penalty=1.0, logprobs=2, prompt_logprobs=2, **base),
        SamplingParams(temperature=0, min_tokens=6, stop_token_ids=[stop_token], **base),
        SamplingParams(temperature=0, stop_token_ids=[stop_token], **base),
        SamplingParams(temperature=0.8, top_k=20, seed=11, **base),
        SamplingParams(temperature=1.0, top_p=0.9, min_p=0.05, seed=12, logprobs=3, **base),
        SamplingParams(temperature=1.2, seed=13, repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3, **base),
        SamplingParams(n=2, temperature=1.0, seed=14, min_tokens=4, stop_token_ids=[stop_token], **base),
        # logit_bias makes the stop token likely and bad words ban it after any first token: a two-token word
        # whose first token is, under async scheduling, still on the device when the ban is decided.
        SamplingParams(temperature=0, logprobs=0, logit_bias={stop_token: 8.0}, bad_words_token_ids=[[t, stop_token] for t in range(VOCAB)],
                       **base),
        SamplingParams(temperature=1.0, seed=15, allowed_token_ids=[stop_token, 3, 5, 7, 11], **base),
        # A grammar: under async scheduling its mask needs the token still in flight.
        SamplingParams(temperature=1.0, seed=16, logprobs=1, structured_outputs=StructuredOutputsParams(regex="[a-z]{3,9}( [a-z]{2,9}){1,4}"),
                       **base),
    ]


def summarize(outputs):
    return [
        [(c.token_ids, c.finish_reason, c.stop_reason,
          None if c.logprobs is None else [sorted((t, round(lp.logprob, 4)) for t, lp in step.items()) for step in c.logprobs])
         for c in o.outputs]
        + [None if o.prompt_logprobs is None else [step and sorted((t, round(lp.logprob, 4)) for t, lp in step.items())
                                                  for step in o.prompt_logprobs]]
        for o in outputs
    ]


def assert_same_outputs(a, b, logprob_atol: float = 1e-3) -> None:
    """Two ``summarize`` results agree: tokens, finish and stop reasons exactly, logprobs within ``logprob_atol``.
    The modes batch the requests differently, and a different batch shape rounds the logits differently in their
    low bits, in float32 too (seen: -2.8764 against -2.8765 on the same token)."""
    floats_a, floats_b = [], []
    assert _without_floats(a, floats_a) == _without_floats(b, floats_b)
    worst = max((0.0 if x == y else abs(x - y) for x, y in zip(floats_a, floats_b)), default=0.0)  # -inf == -inf
    assert worst <= logprob_atol, f"logprobs differ by up to {worst:g}"


def _without_floats(value, floats: list):
    if isinstance(value, float):
        floats.append(value)
        return "logprob"
    if isinstance(value, (list, tuple)):
        return type(value)(_without_floats(v, floats) for v in value)
    return value


# Llama runs with FP8 weights and an FP8 KV cache, so that those paths are compared across the modes too.
@pytest.mark.parametrize("model,quantized", [("qwen3", {}), ("llama", dict(quantization="fp8", kv_cache_dtype="fp8"))],
                         ids=["qwen3", "llama-fp8"])
def test_async_scheduling_equals_sync_for_every_sampling_parameter(model_dirs, tokenizer, model, quantized):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=31)]
    results = {}
    for mode in (False, True):
        llm = make_llm(model_dirs[model], async_scheduling=mode, max_num_batched_tokens=64, **quantized)
        if "stop" not in results:  # a token the model really produces early on, to stop on
            plain = llm.generate(prompts[3], SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
            results["stop"] = plain[0].outputs[0].token_ids[2]
        outputs = llm.generate(prompts, params_per_prompt(results["stop"]), use_tqdm=False)
        results[mode] = summarize(outputs)
        if mode:
            assert llm.engine.step_timing()[0]["max_batches_in_flight"] == 2, "async scheduling did not overlap steps"
    assert_same_outputs(results[True], results[False])
    # The stop token was banned below min_tokens, then allowed.
    min_tokens_ids = results[False][3][0][0]
    assert results["stop"] not in min_tokens_ids[:6]
    # Biased up, the stop token may come first, but the bad words keep it out after that; allowed tokens only.
    biased = results[False][9][0][0]
    assert results["stop"] not in biased[1:]
    assert set(results[False][10][0][0]) <= {results["stop"], 3, 5, 7, 11}


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_greedy_repetition_penalty_matches_transformers_sync_and_async(model_dirs, tokenizer, model):
    prompts = random_prompts(8, len(tokenizer), seed=32)
    expected = hf_greedy(model_dirs[model], prompts, MAX_TOKENS, repetition_penalty=1.3)
    params = SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=MAX_TOKENS, ignore_eos=True)
    for mode in (False, True):
        llm = make_llm(model_dirs[model], async_scheduling=mode)
        got = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)]
        assert got == expected, f"async_scheduling={mode}"


def test_min_tokens_counts_the_token_in_flight(qwen3_dir, tokenizer):
    """A stop token that first appears at output position 4, with min_tokens=4: it may stop there, so the
    output is the first 5 greedy tokens, in both modes."""
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for mode in (False, True):
        llm = make_llm(qwen3_dir, async_scheduling=mode)
        for prompt in random_prompts(12, len(tokenizer), seed=33):
            ids = llm.generate({"prompt_token_ids": prompt}, greedy, use_tqdm=False)[0].outputs[0].token_ids
            if ids[4] not in ids[:4]:
                break
        else:
            pytest.fail("no prompt whose 5th greedy token is new")
        params = greedy.model_copy(update={"min_tokens": 4, "stop_token_ids": [ids[4]]})
        got = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
        assert got.token_ids == ids[:5] and got.finish_reason == "stop", f"async_scheduling={mode}"


def test_preempted_in_the_step_that_granted_it_tokens_resumes_correctly(llama_dir):
    """The KV-cache sizes of the scheduler test that provokes a withdrawn step, on the real model: "low"
    (priority 5) is computing its prompt in chunks of 8 when "high" (priority 0) arrives; the pool runs
    short while "low" holds blocks hashed for a chunk that is then withdrawn. Its output must equal the
    output of an engine with room for both."""
    low_prompt = random_prompts(1, 500, min_len=37, max_len=37, seed=34)[0]
    high_prompt = random_prompts(1, 500, min_len=9, max_len=9, seed=35)[0]
    low_params = SamplingParams(temperature=0, max_tokens=7, ignore_eos=True)
    high_params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    tight = dict(block_size=4, num_kv_blocks=13, max_num_batched_tokens=12, long_prefill_token_threshold=8,
                 scheduling_policy="priority", max_model_len=48)

    def run(**engine_kwargs):
        engine = LLMEngine.from_engine_args(EngineArgs(model=llama_dir, dtype="float32", device="cpu", **engine_kwargs))
        engine.add_request("low", {"prompt_token_ids": low_prompt}, low_params, priority=5)
        outputs, step = {}, 0
        while engine.has_unfinished_requests() or step <= 2:
            if step == 2:
                engine.add_request("high", {"prompt_token_ids": high_prompt}, high_params, priority=0)
            for out in engine.step():
                outputs[out.request_id] = out.outputs[0].token_ids
            step += 1
        return engine, outputs

    tight_engine, got = run(**tight)
    assert tight_engine.engine.stats().num_preemptions > 0
    _, expected = run(**dict(tight, num_kv_blocks=64))
    assert got == expected and len(got["low"]) == 7


def test_penalized_requests_preempted_with_a_token_in_flight_resume_correctly(qwen3_dir):
    """Greedy requests with penalties, under async scheduling, in a KV pool too small for all of them: decode steps
    preempt them while their newest token is still in flight, and the scheduler drops that token. The penalties'
    counts live on the device (engine/token_counts.py) and had already counted it, so a resumed request must start
    from fresh counts. Every output must equal that of an engine with room to spare."""
    prompts = random_prompts(3, 500, min_len=9, max_len=9, seed=36)
    params = SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.7, max_tokens=28, ignore_eos=True)

    def run(**engine_kwargs):
        engine = LLMEngine.from_engine_args(EngineArgs(model=qwen3_dir, dtype="float32", device="cpu", block_size=4, max_model_len=48,
                                                       async_scheduling=True, **engine_kwargs))
        for i, prompt in enumerate(prompts):
            engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
        outputs = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs[out.request_id] = out.outputs[0].token_ids
        return engine, outputs

    tight, got = run(num_kv_blocks=16)
    assert tight.engine.stats().num_preemptions > 0
    _, expected = run(num_kv_blocks=64)
    assert got == expected and all(len(ids) == 28 for ids in got.values())


def random_request(rng: random.Random, vocab: int, prefixes: list[list[int]]) -> tuple[dict, SamplingParams]:
    """A prompt, half of them behind a shared prefix (some the prefix alone), and seeded sampling parameters with a
    random set of features."""
    prefix = rng.choice(prefixes) if rng.random() < 0.5 else []
    prompt = prefix + [rng.randrange(3, vocab) for _ in range(rng.randint(0 if prefix else 1, 40))]
    fields = dict(max_tokens=rng.randint(1, 16), seed=rng.randrange(2**40), temperature=rng.choice([0.0, 0.0, 0.7, 1.3]))
    choices = [("top_k", [1, 5, 50]), ("top_p", [0.3, 0.9]), ("min_p", [0.05, 0.2]), ("repetition_penalty", [0.8, 1.3]),
               ("frequency_penalty", [-0.5, 0.7]), ("presence_penalty", [-0.5, 1.0]), ("min_tokens", [2, 6]),
               ("stop", [["a"], ["th", "s "]]), ("include_stop_str_in_output", [True]), ("logprobs", [0, 3]),
               ("prompt_logprobs", [0, 2]), ("ignore_eos", [True]), ("n", [2, 3]), ("truncate_prompt_tokens", [5, 30]),
               ("bad_words", [["the"], [" and", "x"]])]
    for name, values in choices:
        if rng.random() < 0.25:
            fields[name] = rng.choice(values)
    if rng.random() < 0.2:
        fields["stop_token_ids"] = [rng.randrange(3, vocab) for _ in range(20)]
    if rng.random() < 0.2:
        fields["logit_bias"] = {rng.randrange(3, vocab): rng.choice([-5.0, 5.0]) for _ in range(3)}
    if rng.random() < 0.1:
        fields["allowed_token_ids"] = [rng.randrange(3, vocab) for _ in range(8)]
    if rng.random() < 0.1:
        fields["structured_outputs"] = rng.choice([StructuredOutputsParams(regex="[a-z]{2,6}( [a-z]{1,5}){0,3}"),
                                                   StructuredOutputsParams(choice=["yes", "no", "maybe so"])])
    fields["min_tokens"] = min(fields.get("min_tokens", 0), fields["max_tokens"])
    return {"prompt_token_ids": prompt}, SamplingParams(**fields)


def test_random_requests_through_a_starved_engine_equal_a_roomy_ones(qwen3_dir, tokenizer):
    """Everything at once, on random requests of random features: async scheduling, prefix caching (prompts cached
    whole included), prompts in chunks of 24 tokens a step or 8 a request, a KV pool that preempts, 5 requests a step
    at most, requests arriving while others run, three aborted. Every other request ends as on a synchronous engine
    with room for all, which takes them at once: tokens, text, finish and stop reasons, logprobs, prompt logprobs."""
    rng = random.Random(41)
    # Whole blocks of 16, so that a prompt that is a prefix alone can be cached whole
    prefixes = [[rng.randrange(3, len(tokenizer)) for _ in range(length)] for length in (16, 32, 48)]
    requests = [(f"r{i}", *random_request(rng, len(tokenizer), prefixes)) for i in range(40)]

    def run(starved: bool):
        common = dict(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=128, block_size=16)
        args = (EngineArgs(**common, async_scheduling=True, max_num_batched_tokens=24, long_prefill_token_threshold=8,
                           num_kv_blocks=12, max_num_seqs=5) if starved else
                EngineArgs(**common, async_scheduling=False, enable_prefix_caching=False, max_num_batched_tokens=4096,
                           num_kv_blocks=512))
        engine = LLMEngine.from_engine_args(args)
        waiting, finished, aborted, added = list(requests), {}, set(), []
        for step in range(10_000):
            if not (waiting or engine.has_unfinished_requests()):
                break
            arrive = 1 + step % 3 if starved and engine.has_unfinished_requests() else len(waiting)
            for request_id, prompt, params in waiting[:arrive]:
                engine.add_request(request_id, prompt, params)
                added.append(request_id)
            waiting = waiting[arrive:]
            if starved and step in (3, 11, 25):  # the newest request still in the engine
                victim = next((r for r in reversed(added) if r not in finished and r not in aborted), None)
                if victim is not None:
                    aborted.add(victim)
                    engine.abort_request(victim)
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
        stats = engine.engine.stats()
        engine.shutdown()
        return finished, aborted, stats

    expected, _, _ = run(starved=False)
    got, aborted, stats = run(starved=True)
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0 and len(aborted) == 3
    kept = sorted(set(expected) - aborted)
    assert set(got) - aborted == set(kept) and len(kept) == len(requests) - len(aborted)

    def with_texts(outputs: dict) -> list:
        return summarize([outputs[r] for r in kept]) + [[c.text for c in outputs[r].outputs] for r in kept]

    assert_same_outputs(with_texts(got), with_texts(expected))
