"""Incremental detokenization equals decoding the whole sequence, multi-byte characters included."""

from __future__ import annotations

import random

import pytest

from raygrid import SamplingParams
from raygrid.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "Unicode: café, naïve, 東京, 서울, Москва, emoji 🙂🚀 and more.",
    "def main(): print(\"hello\") return 0",
]


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_equals_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    prompt, output = ids[:3], ids[3:]
    detok = IncrementalDetokenizer(tokenizer, prompt, SamplingParams())
    pieces = [detok.decode_token(t) for t in output]
    assert "".join(pieces) == tokenizer.decode(output)


def test_random_byte_tokens_never_break_the_text(tokenizer):
    rng = random.Random(0)
    for _ in range(20):
        ids = [rng.randrange(3, len(tokenizer)) for _ in range(30)]
        detok = IncrementalDetokenizer(tokenizer, [], SamplingParams())
        detok.update(ids)
        full = tokenizer.decode(ids)
        # Text held back waits for a character to complete; what came out is a prefix of the full decode.
        assert full.startswith(detok.output_text)
        assert len(full) - len(detok.output_text) <= 4
        detok.flush()  # at the end, the held-back bytes come out too
        assert detok.output_text == full


def test_stop_string_spanning_tokens_and_stream_holdback(tokenizer):
    text = "Once upon a time there was a small village by the sea."
    ids = tokenizer.encode(text)
    params = SamplingParams(stop=["small village"])
    detok = IncrementalDetokenizer(tokenizer, [], params)
    streamed = ""
    stop = None
    for t in ids:
        stop = detok.update([t])
        streamed += detok.stream_delta(finished=stop is not None)
        if stop:
            break
        # Never show text that could still turn out to be the start of the stop string.
        assert len(detok.output_text) - len(streamed) <= len("small village") - 1
    assert stop == "small village"
    assert detok.output_text == streamed == "Once upon a time there was a "


class _PythonOnly:
    """The tokenizer without its Rust backend: the detokenizer's Python path (as for a slow tokenizer)."""

    def __init__(self, tokenizer) -> None:
        self.decode = tokenizer.decode


@pytest.mark.parametrize("path", ["rust", "python"])
def test_streamed_and_lazy_text_agree_after_random_prompts(tokenizer, path):
    """Whatever the prompt's tail (incomplete characters included), a stream's pieces plus its flush equal
    the text of a request nobody streamed, on the Rust (DecodeStream) and the Python paths alike."""
    tok = tokenizer if path == "rust" else _PythonOnly(tokenizer)
    rng = random.Random(7)
    for _ in range(60):
        prompt = [rng.randrange(3, len(tokenizer)) for _ in range(rng.randrange(0, 9))]
        output = [rng.randrange(3, len(tokenizer)) for _ in range(rng.randrange(1, 25))]
        streamed = IncrementalDetokenizer(tok, prompt, SamplingParams())
        streamed.update(output)
        streamed.flush()
        lazy = IncrementalDetokenizer(tok, prompt, SamplingParams(), lazy=True)
        lazy.update(output)
        lazy.flush()
        assert streamed.output_text == lazy.output_text
        if not prompt:
            assert lazy.output_text == tokenizer.decode(output)
