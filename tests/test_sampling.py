"""Sampling: the sampler's filters against hand-computed expectations, seeds, logprobs against
transformers' own scores."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from raygrid import LLM, SamplingParams
from raygrid.engine.input_batch import CachedRequestState, InputBatch
from raygrid.engine.sampler import (
    Sampler,
    apply_min_p,
    apply_top_k_top_p,
    row_seeds,
)
from raygrid.engine.sampling_inputs import SamplingInputs
from raygrid.engine.staging import StagingBuffers, step_fields
from raygrid.kernels.ops import apply_penalties, gumbel_argmax
from tests.conftest import hf_greedy, random_prompts

NEG_INF = float("-inf")


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    return LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=256)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [{"prompt_token_ids": p} for p in random_prompts(6, len(tokenizer), seed=3)]


def test_top_k_and_top_p_keep_the_expected_tokens():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.4, 0.1]]))
    out = apply_top_k_top_p(logits, torch.tensor([2, 4]), None)
    assert torch.isinf(out[0, [0, 2]]).all() and torch.isfinite(out[0, [1, 3]]).all()
    assert torch.isfinite(out[1]).all()
    # top_p 0.6 on row 0: 0.4 + 0.3 reach it, so 0.2 and 0.1 go; row 1 with top_p 1 keeps all.
    out = apply_top_k_top_p(logits, None, torch.tensor([0.6, 1.0]))
    assert torch.isfinite(out[0]).tolist() == [False, True, False, True]
    assert torch.isfinite(out[1]).all()


def test_min_p_drops_tokens_below_the_scaled_maximum():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    out = apply_min_p(logits, torch.tensor([0.5]))  # threshold 0.25
    assert torch.isfinite(out[0]).tolist() == [True, True, False, False]


def test_penalties_follow_their_definitions():
    from raygrid.engine.sampler import SamplingMetadata

    logits = torch.tensor([[2.0, -1.0, 0.5, 1.0]])
    counts = torch.tensor([[2.0, 0.0, 1.0, 0.0]])
    prompt_mask = torch.tensor([[False, True, False, False]])
    meta = SamplingMetadata(
        temperature=torch.ones(1), greedy=torch.zeros(1, dtype=torch.bool), all_greedy=False, top_k=None, top_p=None,
        min_p=None, repetition_penalty=torch.tensor([2.0]), frequency_penalty=torch.tensor([0.1]),
        presence_penalty=torch.tensor([0.5]), penalty_slots=torch.tensor([0]), slot_counts=counts, slot_in_prompt=prompt_mask,
        adjust_rows=None, adjust_tokens=None, adjust_values=None, allowed_rows=None, allowed_mask=None, seeds=torch.zeros(1, dtype=torch.long), num_logprobs=[None],
    )
    expected = [2.0 / 2 - 0.1 * 2 - 0.5, -1.0 * 2, 0.5 / 2 - 0.1 - 0.5, 1.0]
    # The sampler applies them in its draw (token 3, 1.0, is the best then; token 0, 2.0, before), or before
    # truncation (here top-k of 4, which keeps every token).
    meta = dataclasses.replace(meta, temperature=torch.zeros(1), greedy=torch.ones(1, dtype=torch.bool), all_greedy=True)
    assert Sampler()(logits.clone(), meta)[0].tolist() == [3]
    assert Sampler()(logits.clone(), dataclasses.replace(meta, top_k=torch.tensor([4])))[0].tolist() == [3]
    out = apply_penalties(logits, meta.penalties())
    assert out[0].tolist() == pytest.approx(expected)


def test_sampling_inputs_and_logprobs_do_not_wait_for_the_gpu():
    """A step's sampling inputs for penalties, logit_bias, a min_tokens ban, a bad word and allowed_token_ids, two rows
    with their newest output still on the device (async scheduling), then its sampling with logprobs: the values are
    right, and on a GPU the host builds and launches them while a spin kernel of about a second queued first still
    runs (a copy from pageable memory, or logprobs read as lists, would wait for it, and async scheduling would stop
    running ahead). The penalties' counts, kept on the device, hold the token just sampled, and the next step's once."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    vocab, eos = 16, 2
    batch = InputBatch(4, 32, 2, frozenset({eos}))
    params = [SamplingParams(temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, logprobs=2),
              SamplingParams(temperature=0.8, logit_bias={5: 2.0}, min_tokens=10),
              SamplingParams(temperature=0.8, allowed_token_ids=[3, 4, 7], bad_words_token_ids=[[6, 8]], logprobs=0)]

    def enter() -> None:  # prompt 1 2 3 4, outputs 5 6 known here
        for i in range(len(params)):
            batch.remove(f"r{i}")
        for i, p in enumerate(params):
            batch.add(CachedRequestState(f"r{i}", [1, 2, 3, 4, 5, 6], 4, p, [1], 6))

    enter()
    rows, positions = np.arange(3), np.array([7, 6, 7])  # rows 0 and 2: their newest output (9, 6) is on the device
    prev_sampled, prev_index = torch.tensor([9, 6], device=device), {"r0": 0, "r2": 1}
    inputs = SamplingInputs(StagingBuffers(device, step_fields(8, 4, 2)), device, vocab, seed=0, max_reqs=4)
    logits = torch.randn(3, vocab, device=device)
    Sampler()(logits, inputs.build(batch, rows, positions, prev_sampled, prev_index))  # warm: pinned blocks of these sizes exist
    enter()  # new entries: their penalties' counts are filled again, from the host's tokens and the one in flight
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda._sleep(2_000_000_000)
        spun = torch.cuda.Event()
        spun.record()
        torch.cuda.set_sync_debug_mode("error")  # a synchronizing call torch knows of raises here, naming itself
    try:
        meta = inputs.build(batch, rows, positions, prev_sampled, prev_index)
        tokens, logprobs = Sampler()(logits, meta)
        inputs.record(meta, tokens)
    finally:
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    if device.type == "cuda":
        assert not spun.query(), "building the sampling inputs or sampling waited for the GPU"
        torch.cuda.synchronize()
    entries = logprobs.entries(tokens.tolist())
    raw = torch.log_softmax(logits.float(), dim=-1)
    assert entries[1] is None and entries[2].token_ids == [tokens[2].item()] and entries[2].sampled_rank >= 1
    assert entries[0].token_ids[1:] == raw[0].topk(2).indices.tolist()
    assert entries[0].logprobs == pytest.approx([raw[0, tokens[0]].item()] + raw[0].topk(2).values.tolist(), abs=1e-5)
    assert tokens[2].item() in (3, 4, 7) and tokens[1].item() != eos
    assert meta.repetition_penalty.tolist() == pytest.approx([1.3, 1.0, 1.0])
    assert meta.frequency_penalty.tolist() == [0.5, 0.0, 0.0] and meta.presence_penalty.tolist() == [0.25, 0.0, 0.0]

    def counts_of(meta):  # rows without penalties count nothing
        return {row: {t: c for t, c in enumerate(meta.slot_counts[meta.penalty_slots[row]].tolist()) if c} for row in range(3)}

    # The outputs 5 6, the newest one still on the device (9), and the token just sampled (recorded on the device).
    expected = {5: 1, 6: 1, 9: 1}
    expected[tokens[0].item()] = expected.get(tokens[0].item(), 0) + 1
    assert counts_of(meta) == {0: expected, 1: {}, 2: {}}
    assert [torch.nonzero(meta.slot_in_prompt[meta.penalty_slots[row]]).flatten().tolist() for row in range(3)] == [[1, 2, 3, 4], [], []]
    adjusted = list(zip(meta.adjust_rows.tolist(), meta.adjust_tokens.tolist(), meta.adjust_values.tolist()))
    assert adjusted == [(1, eos, NEG_INF), (1, 5, 2.0), (2, 8, NEG_INF)]  # row 2's newest output is 6: 8 is banned
    assert meta.allowed_rows.tolist() == [2]
    assert torch.nonzero(meta.allowed_mask[0] == 0).flatten().tolist() == [3, 4, 7]

    # The next step: the host now knows 9, 6 and row 1's token; the tokens just sampled are in flight.
    batch.append_one_token_each([0, 1, 2], [9, tokens[1].item(), 6])
    following = inputs.build(batch, rows, positions + 1, tokens, {"r0": 0, "r1": 1, "r2": 2})
    assert counts_of(following) == {0: expected, 1: {}, 2: {}}  # counted once, not again from the host's copy


def test_sampling_inputs_keep_a_steady_batchs_parameters_and_stage_them_again_when_it_changes():
    """A decode step of an unchanged batch takes the rows' parameters staged by the step before (only its seeds are
    staged again); a request that joins, a change of the sampled rows, or a new batch (the runner makes one after a
    failed step, counting its versions from 0 again) stages them again."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    inputs = SamplingInputs(StagingBuffers(device, step_fields(8, 4, 2)), device, 16, seed=0, max_reqs=4)
    rows, positions = np.arange(1), np.array([6])

    def batch_of(*params: SamplingParams) -> InputBatch:
        batch = InputBatch(4, 32, 2, frozenset({2}))
        for i, p in enumerate(params):
            batch.add(CachedRequestState(f"r{i}", [1, 2, 3, 4, 5, 6], 4, p, [1], 6))
        return batch

    greedy = batch_of(SamplingParams(temperature=0, logprobs=1))
    first = inputs.build(greedy, rows, positions, None, {})
    first_seeds = first.seeds.tolist()  # a view of the staged field, which the next step writes again
    again = inputs.build(greedy, rows, positions + 1, None, {})
    assert first.all_greedy and again.all_greedy and again.num_logprobs == [1] and again.top_k is None
    assert again.temperature.data_ptr() == first.temperature.data_ptr() and again.temperature.tolist() == [0.0]
    assert again.seeds.tolist() != first_seeds  # the noise is drawn again every step

    # The same version count and rows in a new batch, whose request samples with top_k and a penalty.
    other = batch_of(SamplingParams(temperature=0.5, top_k=3, presence_penalty=0.5))
    assert other.version == greedy.version
    meta = inputs.build(other, rows, positions, None, {})
    assert not meta.all_greedy and meta.temperature.tolist() == [0.5] and meta.top_k.tolist() == [3]
    assert meta.presence_penalty.tolist() == [0.5] and meta.num_logprobs == [None]

    # Its request leaves and another takes its row.
    other.remove("r0")
    other.add(CachedRequestState("r5", [1, 2, 3], 3, SamplingParams(temperature=0.9), [1], 3))
    replaced = inputs.build(other, rows, np.array([3]), None, {})
    assert not replaced.all_greedy and replaced.temperature.tolist() == pytest.approx([0.9])
    assert replaced.top_k is None and replaced.presence_penalty is None

    # A request joins: both rows sample, then only the second (the first mid-prompt, say).
    other.add(CachedRequestState("r9", [1, 2, 3], 3, SamplingParams(temperature=0, top_k=7), [1], 3))
    both = inputs.build(other, np.arange(2), np.array([3, 3]), None, {})
    assert both.temperature.tolist() == pytest.approx([0.9, 0.0]) and both.top_k.tolist() == [16, 7]
    second = inputs.build(other, np.arange(1, 2), np.array([3]), None, {})
    assert second.all_greedy and second.top_k.tolist() == [7] and second.presence_penalty is None


def test_row_seeds_depend_on_request_seed_and_position_only():
    fresh = np.array([11, 22, 33, 44], dtype=np.int64)
    seeds = row_seeds(np.array([5, 0, 5, 6]), np.array([True, False, True, True]), np.array([100, 100, 101, 100]), fresh)
    assert seeds[1] == 22  # no request seed: the fresh one
    assert len({int(seeds[0]), int(seeds[2]), int(seeds[3])}) == 3 and (seeds >= 0).all()
    again = row_seeds(np.array([0, 5]), np.array([False, True]), np.array([7, 100]), np.array([1, 2], dtype=np.int64))
    assert again[1] == seeds[0]  # same seed and position, other row and batch: same noise
    # Any int64 is a seed (vLLM's range): negative ones and the extremes hash to valid, distinct noise seeds.
    extremes = row_seeds(np.array([-(2**63), -1, 2**63 - 1, 0]), np.ones(4, dtype=bool), np.full(4, 9), fresh)
    assert len(set(extremes.tolist())) == 4 and (extremes >= 0).all()


def test_gumbel_draws_follow_the_softmax():
    """20,000 draws over 5 tokens at temperature 0.7: each frequency within 4 standard errors of softmax."""
    logits = torch.tensor([1.0, 0.2, -0.5, 0.8, -2.0])
    n = 20_000
    temperature = torch.full((n,), 0.7)
    tokens = gumbel_argmax(logits.expand(n, -1), temperature, torch.arange(n))
    freq = torch.bincount(tokens, minlength=5).double() / n
    p = torch.softmax(logits.double() / 0.7, dim=0)
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt()).all(), (freq, p)
    greedy = gumbel_argmax(logits.expand(3, -1), torch.zeros(3), torch.tensor([1, 2, 3]))
    assert greedy.tolist() == [0, 0, 0]


def test_seeded_requests_do_not_depend_on_the_batch(llm, prompts):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate(prompts[0], params, use_tqdm=False)[0].outputs[0].token_ids
    noisy = [SamplingParams(temperature=1.3, max_tokens=20, ignore_eos=True)] * (len(prompts) - 1)
    in_batch = llm.generate(prompts, [params] + noisy, use_tqdm=False)[0].outputs[0].token_ids
    assert alone == in_batch
    other_seed = llm.generate(prompts[0], params.model_copy(update={"seed": 99}), use_tqdm=False)[0].outputs[0].token_ids
    assert other_seed != alone


def test_n_completions_are_distinct_and_reproducible(llm, prompts):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    first = llm.generate(prompts[1], params, use_tqdm=False)[0]
    again = llm.generate(prompts[1], params, use_tqdm=False)[0]
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3


def test_top_k_1_is_greedy(llm, prompts):
    greedy = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    top1 = llm.generate(prompts, SamplingParams(temperature=0.8, top_k=1, max_tokens=8, ignore_eos=True), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in top1]


def test_repetition_penalty_matches_transformers(llm, qwen3_dir, prompts):
    """transformers' RepetitionPenaltyLogitsProcessor over prompt and outputs is the reference."""
    ids = [p["prompt_token_ids"] for p in prompts]
    expected = hf_greedy(qwen3_dir, ids, 16, repetition_penalty=1.5)
    plain = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    penalized = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.5), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in penalized] == expected
    assert [o.outputs[0].token_ids for o in plain] != expected  # the penalty changed something


def test_presence_penalty_makes_repeats_rarer(llm, prompts):
    plain = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    penalized = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, presence_penalty=2.0), use_tqdm=False)
    repeats = lambda ids: len(ids) - len(set(ids))  # noqa: E731
    assert sum(repeats(q.outputs[0].token_ids) for q in penalized) < sum(repeats(p.outputs[0].token_ids) for p in plain)


def test_logprobs_match_transformers_scores(llm, qwen3_dir, prompts):
    prompt = prompts[2]["prompt_token_ids"]
    out = llm.generate(prompts[2], SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True), use_tqdm=False)[0]
    completion = out.outputs[0]
    model = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion.token_ids])).logits[0]
    reference = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    total = 0.0
    for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        assert entry[token].rank == 1  # greedy picks the top token
        assert entry[token].logprob == pytest.approx(reference[step, token].item(), abs=1e-4)
        top3 = reference[step].topk(3).indices.tolist()
        assert set(top3) <= set(entry)
        assert entry[top3[1]].rank == 2 and entry[top3[2]].rank == 3
        assert isinstance(entry[token].decoded_token, str)
        total += entry[token].logprob
    assert completion.cumulative_logprob == pytest.approx(total)
    assert math.isfinite(total)
