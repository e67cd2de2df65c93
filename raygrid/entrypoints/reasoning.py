"""Reasoning parsers (``--reasoning-parser``), as vLLM's: split a chat reply's thinking, ``<think>...</think>``
for Qwen3, into ``reasoning_content`` and leave the answer in ``content``, for whole replies and for streams.

A reply thinks when it opens with ``<think>``, or when the prompt already opened it (a template that ends the
prompt with ``<think>``). Thinking runs to ``</think>``; a reply cut off before it is all reasoning. A reply
that does not think is all content.
"""

from __future__ import annotations


class Qwen3ReasoningParser:
    start, end = "<think>", "</think>"

    def opens_thinking(self, prompt_text: str) -> bool:
        return prompt_text.rstrip().endswith(self.start)

    def split(self, text: str, prompt_opened: bool = False) -> tuple[str | None, str]:
        """A whole reply -> (reasoning_content or None, content)."""
        stream = self.stream(prompt_opened)
        reasoning, content = stream.feed(text)
        more_reasoning, more_content = stream.finish()
        reasoning, content = reasoning + more_reasoning, content + more_content
        return (reasoning if stream.thought else None), content

    def stream(self, prompt_opened: bool = False) -> "ReasoningStream":
        return ReasoningStream(self, prompt_opened)


class ReasoningStream:
    """One choice's stream: ``feed(delta_text)`` returns the (reasoning, content) text to send now, holding
    back only what could still be the start of a tag; ``finish()`` returns what is left when the reply ends."""

    def __init__(self, parser: Qwen3ReasoningParser, prompt_opened: bool = False) -> None:
        self.parser = parser
        self._pending = ""
        self._state = "reasoning" if prompt_opened else "undecided"  # then "reasoning" or "content"
        self.thought = prompt_opened
        self._skip_newlines = prompt_opened  # the newlines right after a tag are the tag's, not the text's

    def feed(self, text: str) -> tuple[str, str]:
        self._pending += text
        reasoning = content = ""
        if self._state == "undecided":
            head = self._pending.lstrip()
            if head.startswith(self.parser.start):
                self._state, self.thought, self._skip_newlines = "reasoning", True, True
                self._pending = head[len(self.parser.start):]
            elif self.parser.start.startswith(head):
                return "", ""  # could still be the opening tag
            else:
                self._state = "content"
        self._drop_tag_newlines()
        if self._state == "reasoning":
            before, found, after = self._pending.partition(self.parser.end)
            if not found:
                # Hold back what could be the start of </think>, and the newlines that may come before it.
                keep = _partial_suffix(self._pending, self.parser.end)
                keep += len(self._pending[: len(self._pending) - keep]) - len(self._pending[: len(self._pending) - keep].rstrip("\n"))
                cut = len(self._pending) - keep
                reasoning, self._pending = self._pending[:cut], self._pending[cut:]
                return reasoning, ""
            reasoning, self._state, self._pending, self._skip_newlines = before.rstrip("\n"), "content", after, True
            self._drop_tag_newlines()
        content, self._pending = self._pending, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self._pending = self._pending, ""
        return (rest.rstrip("\n"), "") if self._state == "reasoning" else ("", rest)

    def _drop_tag_newlines(self) -> None:
        if self._skip_newlines:
            self._pending = self._pending.lstrip("\n")
            self._skip_newlines = not self._pending


def _partial_suffix(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the beginning of ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


REASONING_PARSERS = {"qwen3": Qwen3ReasoningParser}
