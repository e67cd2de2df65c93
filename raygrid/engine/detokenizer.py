"""Incremental detokenization with stop strings.

Decoding token by token is wrong for byte-level BPE (one character can span tokens) and for
tokenizers that drop a leading space at the start of a decode. So each new token is decoded
together with a few tokens before it, and only the text past what those already produced counts;
a trailing U+FFFD means a character is still incomplete and we wait for more tokens. A fast tokenizer
does this in Rust (``tokenizers``' DecodeStream, about 1 us a token against 10 us for two Python
decodes); other tokenizers take the Python path.
"""

from __future__ import annotations

import codecs

from raygrid.engine.sampling_params import SamplingParams

# Prompt tokens kept as left context for the first output tokens.
_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """``lazy``: nobody reads the text before the request ends (no stop strings, no stream), so tokens
    are only collected and decoded once, in ``flush``; ``params.detokenize=False`` skips text entirely."""

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams, lazy: bool = False) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.lazy = lazy and not params.stop
        self.enabled = params.detokenize
        context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._ids = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._num_decoded = len(context)  # ids of _ids decoded so far (the context counts as decoded)
        self.output_text = ""
        self.token_ids: list[int] = []
        # Streaming: characters of output_text already handed out, and how many to hold back (a stop string
        # may still be forming), computed once rather than per token.
        self._num_streamed_chars = 0
        self._hold_back = max(params.max_stop_len - 1, 0)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream = None
        if backend is not None and self.enabled:
            from tokenizers.decoders import DecodeStream

            self._backend = backend
            self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
            for token_id in context:  # the prompt's tail as left context; its text is not output
                self._stream.step(backend, token_id)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.params.skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def decode_token(self, token_id: int) -> str:
        """The text one more token adds (possibly empty until a character completes)."""
        self._ids.append(token_id)
        self.token_ids.append(token_id)
        return self._decode_next()

    def _decode_next(self) -> str:
        """Decode the first id of ``_ids`` not decoded yet."""
        index = self._num_decoded
        self._num_decoded += 1
        if self._stream is not None:
            text = self._stream.step(self._backend, self._ids[index])
            if text is None:
                return ""  # a character is still incomplete
            # Where flush() starts if the request ends while a character is incomplete.
            self._read_offset = index + 1
            self._prefix_offset = max(self._read_offset - _CONTEXT_TOKENS, 0)
            return text
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset : index + 1])
        if len(full_text) > len(prefix_text) and not full_text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, index + 1
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> None:
        """At the end of a request, add the bytes still waiting for a character to complete (they decode
        to U+FFFD), so the text equals decoding all the output tokens at once."""
        if not self.enabled:
            return
        if self._stream is not None:  # a lazy request's tokens, decoded as a stream would have
            while self._num_decoded < len(self._ids):
                self.output_text += self._decode_next()
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) > len(prefix_text):
            self.output_text += full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._ids)

    def update(self, new_token_ids: list[int], stop_token_last: bool = False) -> str | None:
        """Add tokens; returns the stop string that matched (text is then cut there), else None. As in vLLM, a stop
        string counts only where it ends in the text of a token past the first ``min_tokens``, and the EOS or stop
        token that ended the request (``stop_token_last``) adds no text unless ``include_stop_str_in_output``."""
        textless_last = stop_token_last and not self.params.include_stop_str_in_output
        if not textless_last:
            return self._add(new_token_ids)
        stop = self._add(new_token_ids[:-1])
        if stop is None:
            self.token_ids.append(new_token_ids[-1])  # an output token, but never decoded (nor by flush)
        return stop

    def _add(self, new_token_ids: list[int]) -> str | None:
        """Decode tokens (or, lazily, only keep them) and look for stop strings in their text."""
        if self.lazy or not self.enabled:
            self._ids.extend(new_token_ids)
            self.token_ids.extend(new_token_ids)
            return None
        for token_id in new_token_ids:
            delta = self.decode_token(token_id)
            self.output_text += delta
            if delta and self.params.stop and len(self.token_ids) > self.params.min_tokens:
                stop = self._find_stop(len(delta))
                if stop is not None:
                    return stop
        return None

    def _find_stop(self, num_new_chars: int) -> str | None:
        for stop in self.params.stop:
            # Only a match that ends inside the new text is new.
            index = self.output_text.find(stop, max(len(self.output_text) - num_new_chars - len(stop) + 1, 0))
            if index == -1:
                continue
            end = index + len(stop) if self.params.include_stop_str_in_output else index
            self.output_text = self.output_text[:end]
            return stop
        return None

    def stream_delta(self, finished: bool) -> str:
        """New text for a stream, holding back what could still become part of a stop string."""
        hold = 0 if finished else self._hold_back
        end = max(len(self.output_text) - hold, self._num_streamed_chars)
        delta = self.output_text[self._num_streamed_chars : end]
        self._num_streamed_chars = end
        return delta


class TokenBytes:
    """The bytes one token stands for, which its decoded text cannot give when the token holds part of a
    UTF-8 character (it decodes alone to U+FFFD). Byte-level BPE tokens (GPT-2's byte-to-character map) and
    SentencePiece byte tokens (``<0xE4>``) are mapped back to their bytes; other tokens give their text's UTF-8."""

    def __init__(self, tokenizer) -> None:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.tokenizer = tokenizer
        self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._byte_level = backend is not None and type(backend.decoder).__name__ == "ByteLevel"
        self._special = set(getattr(tokenizer, "all_special_tokens", []))
        self._cache: dict[int, list[int]] = {}

    def __call__(self, token_id: int) -> list[int]:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = list(self._bytes(token_id))
        return cached

    def _bytes(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        if piece in self._special:
            return piece.encode("utf-8")
        if self._byte_level and all(c in self._byte_of for c in piece):
            return bytes(self._byte_of[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")


class TextOffsets:
    """The character offset, in a decoded text, at which each of its tokens starts (OpenAI's legacy ``text_offset``),
    counted from ``start``. Tokens are fed in order. A character split over tokens is counted when its last byte
    comes, so each of its tokens takes the offset of that character. Summing the lengths of tokens decoded one by one
    instead counts a U+FFFD for each piece of a split character and drifts from the text.

    Special tokens the text may leave out: those in ``skipped`` add nothing (an output decoded without them); with
    ``text`` given, one of ``specials`` adds its length only where ``text`` has it at that point (a prompt's text
    as the caller wrote it, which has no BOS that tokenizing it added, but may hold special tokens it spelled out)."""

    def __init__(self, token_bytes: TokenBytes, start: int = 0, skipped: frozenset[int] = frozenset(),
                 text: str | None = None, specials: frozenset[int] = frozenset()) -> None:
        self._token_bytes = token_bytes
        self._skipped = skipped
        self._text, self._specials = text, specials if text is not None else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.next = start

    def __call__(self, token_id: int) -> int:
        offset = self.next
        if token_id in self._specials:
            piece = bytes(self._token_bytes(token_id)).decode("utf-8", "replace")
            if self._text.startswith(piece, offset):
                self.next += len(piece)
        elif token_id not in self._skipped:
            self.next += len(self._utf8.decode(bytes(self._token_bytes(token_id))))
        return offset
