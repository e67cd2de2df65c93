"""Stop strings, stop token ids, min_tokens and max_tokens end generation with the right reason and text."""

from __future__ import annotations

import pytest

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    return LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=256)


@pytest.fixture(scope="module")
def baseline(llm, tokenizer):
    """Greedy outputs without any stop condition, to pick stops that are sure to occur."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, len(tokenizer), seed=5)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    return prompts, outputs


def greedy(**kwargs):
    return SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **kwargs)


def test_max_tokens_gives_length(baseline):
    _, outputs = baseline
    for out in outputs:
        assert len(out.outputs[0].token_ids) == 24
        assert out.outputs[0].finish_reason == "length"


def test_stop_string_cuts_the_text(llm, baseline):
    prompts, outputs = baseline
    for prompt, out in zip(prompts, outputs):
        text = out.outputs[0].text
        # A stop string from the middle of the text, which may well span token boundaries.
        start = len(text) // 2
        stop = text[start : start + 3]
        first = text.find(stop)
        got = llm.generate(prompt, greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
        assert got.finish_reason == "stop" and got.stop_reason == stop
        assert got.text == text[:first]
        kept = llm.generate(prompt, greedy(stop=stop, include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
        assert kept.text == text[: first + len(stop)]
        assert kept.token_ids == out.outputs[0].token_ids[: len(kept.token_ids)]


def test_stop_token_ids(llm, baseline):
    """The stop token is the last output token; as in vLLM its text is left out of the output's text unless
    include_stop_str_in_output, both where the text is decoded once at the end and where it is decoded token by
    token (a stop string that never matches makes it so)."""
    prompts, outputs = baseline
    ids = outputs[0].outputs[0].token_ids
    stop_id = ids[5]
    end = ids.index(stop_id)
    tokenizer = llm.get_tokenizer()
    for incremental in ([], ["never in this text \x00"]):
        got = llm.generate(prompts[0], greedy(stop_token_ids=[stop_id], stop=incremental), use_tqdm=False)[0].outputs[0]
        assert got.finish_reason == "stop" and got.stop_reason == stop_id
        assert got.token_ids == ids[: end + 1]
        assert got.text == tokenizer.decode(ids[:end]) and tokenizer.decode([stop_id]).strip()
        kept = llm.generate(prompts[0], greedy(stop_token_ids=[stop_id], stop=incremental, include_stop_str_in_output=True),
                            use_tqdm=False)[0].outputs[0]
        assert kept.token_ids == got.token_ids and kept.text == tokenizer.decode(ids[: end + 1])


def test_min_tokens_holds_off_stop_tokens(llm, baseline):
    prompts, outputs = baseline
    ids = outputs[1].outputs[0].token_ids
    # A stop token the model emits first: banned below min_tokens, so greedy picks the runner-up there.
    banned = llm.generate(prompts[1], greedy(stop_token_ids=[ids[0]], min_tokens=4), use_tqdm=False)[0].outputs[0]
    assert ids[0] not in banned.token_ids[:4] and banned.token_ids[0] != ids[0]
    # A stop token that first appears at position k >= min_tokens: the ban never bites, it stops right there.
    k = next(i for i in range(4, len(ids)) if ids[i] not in ids[:i])
    got = llm.generate(prompts[1], greedy(stop_token_ids=[ids[k]], min_tokens=4), use_tqdm=False)[0].outputs[0]
    assert got.token_ids == ids[: k + 1]
    assert got.finish_reason == "stop" and got.stop_reason == ids[k]


def test_min_tokens_holds_off_stop_strings(llm, baseline):
    """As vLLM (its test_min_tokens_with_stop): a stop string that ends in the text of the first min_tokens tokens
    does not stop the request; the first one ending past them does. Before, min_tokens held off only stop tokens."""
    prompts, outputs = baseline
    tokenizer, checked = llm.get_tokenizer(), 0
    for prompt, out in zip(prompts, outputs):
        ids, text = out.outputs[0].token_ids, out.outputs[0].text
        early = tokenizer.decode(ids[:2])  # the text of the first two tokens
        if not early.strip():
            continue
        checked += 1
        stop = early.strip()[-1]  # a character of it: it matches inside the first min_tokens=4 tokens
        held_text = tokenizer.decode(ids[:4])
        later = text.find(stop, len(held_text) - len(stop) + 1)  # the first match that ends past the fourth token
        got = llm.generate(prompt, greedy(stop=[stop], min_tokens=4), use_tqdm=False)[0].outputs[0]
        if later == -1:
            assert got.finish_reason == "length" and got.text == text
        else:
            assert got.finish_reason == "stop" and got.stop_reason == stop and got.text == text[:later]
        plain = llm.generate(prompt, greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
        assert plain.finish_reason == "stop" and plain.text == text[:text.find(stop)]
    assert checked >= 2


def test_eos_stops_unless_ignored(llm, baseline):
    prompts, outputs = baseline
    ids = outputs[2].outputs[0].token_ids
    original = llm.processor.eos_token_ids
    llm.processor.eos_token_ids = frozenset({ids[3]})  # the model's own 4th greedy token plays EOS
    try:
        ignored = llm.generate(prompts[2], greedy(), use_tqdm=False)[0].outputs[0]
        stopped = llm.generate(prompts[2], SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)[0].outputs[0]
    finally:
        llm.processor.eos_token_ids = original
    assert ignored.finish_reason == "length" and ignored.token_ids == ids
    assert stopped.finish_reason == "stop" and stopped.stop_reason is None
    assert stopped.token_ids == ids[: ids.index(ids[3]) + 1]
    # EOS adds no text (here it is an ordinary token, so its text would show), as a stop token's.
    assert stopped.text == llm.get_tokenizer().decode(stopped.token_ids[:-1])


def test_a_stop_string_then_later_steps_in_one_batch_finish_once(llm, baseline):
    """A front end that fell behind gets several engine steps at once: the stop string ends the request in
    an early one, and the steps the engine ran before it saw the abort (the last one finished "length")
    must not finish it again (once they left the request unfinished forever, and its client waiting)."""
    from raygrid.engine.output_processor import OutputProcessor
    from raygrid.engine.outputs import EngineCoreOutput

    prompts, outputs = baseline
    tokens, text = outputs[0].outputs[0].token_ids, outputs[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    processor = OutputProcessor(llm.processor.tokenizer)
    processed = llm.processor.process("r", prompts[0], greedy(stop=[stop]))
    processor.add_request(processed, delta=False)
    steps = [EngineCoreOutput("r", [t], []) for t in tokens[:-1]] + [EngineCoreOutput("r", [tokens[-1]], [], finish_reason="length")]
    results, to_abort = processor.process(steps)
    assert to_abort == ["r"] and len(results) == 1 and results[0].finished
    assert results[0].outputs[0].finish_reason == "stop" and results[0].outputs[0].text == text[: text.find(stop)]
    assert processor.process([EngineCoreOutput("r", [], [], finish_reason="abort")]) == ([], [])  # forgotten
