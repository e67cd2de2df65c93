"""Tool calling in chat completions.

- ``tool_choice="auto"`` (the default when tools are given) needs a parser (``--tool-call-parser hermes``): the
  model writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, as Qwen3's and Hermes'
  templates teach, and the parser turns them into OpenAI ``tool_calls``.
- ``"required"`` and a named function are enforced by structured outputs: the output is constrained to a JSON
  array of calls (``[{"name": ..., "parameters": {...}}]``) or to the named function's arguments, then read
  back as ``tool_calls``.
- ``"none"``: the tools still reach the template, and the output is plain content.

Streamed, each call goes out as soon as its name is whole, and its arguments follow as they are written
(``JsonCallsReader``); a call's arguments are the text the model wrote, streamed or not.

``parallel_tool_calls=false`` keeps a reply to one call: "required" is constrained to an array of one, and
"auto" keeps the first block that names a function (later ones are dropped, as vLLM does).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from raygrid.engine.sampling_params import StructuredOutputsParams

TOOL_CALL_PARSERS = ("hermes",)
OPEN, CLOSE = "<tool_call>", "</tool_call>"


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def tool_call(name: str, arguments: str, index: int | None = None) -> dict:
    """One OpenAI tool call (with ``index`` for a streamed delta)."""
    call = {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
    return call if index is None else {"index": index, **call}


def forced_schema(tools: list[dict], tool_choice, parallel: bool = True) -> StructuredOutputsParams | None:
    """The grammar that enforces ``tool_choice`` (None for "auto" and "none"). ``tools`` are OpenAI
    function tools as dicts; a named choice is {"type": "function", "function": {"name": ...}}; ``parallel``
    False allows one call."""
    if tool_choice == "required":
        one_call = [{"type": "object", "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                                                       "parameters": parameters_of(t)},
                     "required": ["name", "parameters"], "additionalProperties": False} for t in tools]
        calls = {"type": "array", "minItems": 1, "items": {"anyOf": one_call}}
        return StructuredOutputsParams(json=calls if parallel else dict(calls, maxItems=1))
    if isinstance(tool_choice, dict):
        return StructuredOutputsParams(json=parameters_of(named_tool(tools, tool_choice)))
    return None


def parameters_of(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def named_tool(tools: list[dict], tool_choice: dict) -> dict:
    name = tool_choice["function"]["name"]
    for tool in tools:
        if tool["function"]["name"] == name:
            return tool
    raise ValueError(f"tool_choice names function {name!r}, which is not among tools")


def forced_calls(text: str, tool_choice) -> list[dict]:
    """The tool calls of a complete output made under a forced ``tool_choice``. A named function's output is its
    arguments, as written and as streamed, also where max_tokens or a stop string cut them short (as OpenAI returns
    such a call, with finish_reason "length"). A "required" array gives its calls, each call's arguments as written;
    where it was cut short, the calls whose name is whole, the last one's arguments as far as they got (none: [])."""
    if isinstance(tool_choice, dict):
        return [tool_call(tool_choice["function"]["name"], text)]
    return joined_calls(JsonCallsReader().feed(text))


def joined_calls(deltas: list[dict]) -> list[dict]:
    """Streamed tool-call deltas put together into whole calls, as a client does (a whole call has no index)."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        if delta["index"] not in calls:
            calls[delta["index"]] = {"id": delta["id"], "type": delta["type"], "function": dict(delta["function"])}
        else:
            calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    return list(calls.values())


@dataclass
class _CallRead:
    """One call as it is read: its name once whole, where its arguments start and end in the text, and how much of
    them has been sent."""

    index: int
    name: str | None = None
    args_start: int | None = None
    args_end: int | None = None
    sent: int = 0  # characters of the arguments sent
    announced: bool = False  # its first delta (id, type, name) sent


class JsonCallsReader:
    """Incremental reading of tool calls written as JSON objects ``{"name": ..., ARGS_KEY: ...}`` at ``call_depth``
    (1: the text is one call, a Hermes block's body; 2: an array of calls, a "required" reply). Keys may come in
    either order, with any whitespace. ``feed`` returns the tool-call deltas that the new text completes: a call's
    first delta (id, type, name, no arguments) as soon as its name string closes, then its arguments' text as
    written, each character once it cannot be whitespace between tokens. Where the arguments are a JSON string
    (``string_args``, as some models write a Hermes block's), they go out decoded, once the string closes. The scan
    keeps a handful of states and looks at each character once."""

    def __init__(self, call_depth: int = 2, args_key: str = "parameters", string_args: bool = False,
                 first_index: int = 0) -> None:
        self.call_depth, self.args_key, self.string_args, self.first_index = call_depth, args_key, string_args, first_index
        self.text = ""
        self.depth = 0  # outside everything 0; a call's object is call_depth, inside its values deeper
        self.in_string = False
        self.escaped = False
        self.string_start = 0
        self.expect_key = False  # in a call's object, the next string is a key
        self.key: str | None = None  # the key whose value is being read, in a call's object
        self.awaiting_value = False  # after the key's ':', before its value's first character
        self.value_end = 0  # one past the last character of the value being read, outside whitespace between tokens
        self.calls: list[_CallRead] = []
        self.done = False  # a text of one call (call_depth 1) has closed its object: what follows is not read

    def feed(self, text: str) -> list[dict]:
        scanned, self.text = len(self.text), self.text + text
        for i in range(scanned, len(self.text)):
            self._scan(i, self.text[i])
        return self._deltas()

    def _scan(self, i: int, ch: str) -> None:
        if self.done:
            return
        top = self.depth == self.call_depth  # in a call's object, outside its values
        if self.in_string:  # every character of a string counts, whitespace too
            self.value_end = i + 1
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if top:
                    self._string_closed(json.loads(self.text[self.string_start:i + 1]))
            return
        if ch in " \t\n\r":
            return
        if self.awaiting_value and top:
            self.awaiting_value = False
            if self.key == self.args_key and self.calls[-1].args_start is None:
                self.calls[-1].args_start = i
        if not (top and ch in ",:}"):  # a value's own character, not a call object's punctuation
            self.value_end = i + 1
        if ch == '"':
            self.in_string, self.string_start = True, i
        elif ch in "{[":
            self.depth += 1
            if self.depth == self.call_depth and ch == "{":
                self.calls.append(_CallRead(self.first_index + len(self.calls)))
                self.expect_key, self.key = True, None
        elif ch in "}]":
            if top:
                self._value_closed()
                self.done = self.call_depth == 1
            self.depth -= 1
        elif top and ch == ",":
            self._value_closed()
            self.expect_key, self.key = True, None
        elif top and ch == ":":
            self.awaiting_value = True

    def _string_closed(self, value: str) -> None:
        if not self.calls:
            return
        if self.expect_key:
            self.expect_key, self.key = False, value
        elif self.key == "name" and self.calls[-1].name is None:
            self.calls[-1].name = value

    def _value_closed(self) -> None:
        call = self.calls[-1] if self.calls else None
        if call is not None and self.key == self.args_key and call.args_start is not None and call.args_end is None:
            call.args_end = self.value_end

    def _deltas(self) -> list[dict]:
        deltas = []
        for call in self.calls:
            if call.name is None:
                continue  # its arguments wait for its name (written after them)
            if not call.announced:
                call.announced = True
                deltas.append(tool_call(call.name, "", index=call.index))
            if call.args_start is None:
                continue
            if self.string_args and self.text[call.args_start] == '"':  # a JSON string: its text, once whole
                if call.args_end is not None and not call.sent:
                    call.sent = call.args_end - call.args_start
                    deltas.append({"index": call.index, "function": {
                        "arguments": json.loads(self.text[call.args_start:call.args_end])}})
                continue
            end = call.args_end if call.args_end is not None else max(self.value_end, call.args_start)
            if end > call.args_start + call.sent:
                deltas.append({"index": call.index, "function": {"arguments": self.text[call.args_start + call.sent:end]}})
                call.sent = end - call.args_start
        return deltas


def parse_hermes(text: str, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """A whole reply -> (its content outside tool calls, as ``HermesStream`` streams it: as written, or None where
    it is empty or only whitespace around tool calls; its tool calls). A block that names no function stays in the
    content."""
    parser = HermesStream(limit=None if parallel else 1)
    content, deltas = parser.feed(text)
    more_content, more_deltas = parser.finish()
    content += more_content
    return (content or None), joined_calls(deltas + more_deltas)


@dataclass
class HermesStream:
    """Incremental ``<tool_call>`` parsing of a streamed reply: text outside the blocks is content, sent as
    soon as it cannot be the start of a tag. A block's body is read as it comes (``JsonCallsReader``): its call
    goes out once its name is whole, and its arguments as written; a block that ends without naming a function
    (its JSON broken before that, or no "name" string) is content. A whole call without arguments gets "{}".

    Content that is all whitespace so far is held: a reply of tool calls alone (Qwen3 writes "\n\n" before and
    between its blocks) then has no content, as the whole reply's parse gives; content with more goes out whole."""

    buffer: str = ""
    block: JsonCallsReader | None = None  # the open block's reader
    calls: int = 0
    limit: int | None = None  # the calls kept (parallel_tool_calls=false: 1); the blocks after them are dropped
    held: str = ""  # content that is whitespace so far
    spoken: bool = False  # whether content went out

    def feed(self, text: str) -> tuple[str, list[dict]]:
        """New text -> (content to send now, tool-call deltas)."""
        self.buffer += text
        content, deltas = [], []
        while True:
            if self.block is None:
                at = self.buffer.find(OPEN)
                if at < 0:
                    keep = partial_tag_length(self.buffer, OPEN)
                    content.append(self.buffer[: len(self.buffer) - keep])
                    self.buffer = self.buffer[len(self.buffer) - keep:]
                    break
                content.append(self.buffer[:at])
                self.buffer = self.buffer[at + len(OPEN):]
                self.block = JsonCallsReader(call_depth=1, args_key="arguments", string_args=True, first_index=self.calls)
                continue
            end = self.buffer.find(CLOSE)
            ready = len(self.buffer) - partial_tag_length(self.buffer, CLOSE) if end < 0 else end
            deltas += self._read(self.buffer[:ready])
            if end < 0:
                self.buffer = self.buffer[ready:]
                break
            self.buffer = self.buffer[end + len(CLOSE):]
            text_back, more = self._close_block(CLOSE)
            content.append(text_back)
            deltas += more
        return self._content("".join(content)), deltas

    def finish(self) -> tuple[str, list[dict]]:
        """The end of the reply: what is left is content, or the open block's call as far as it got. Held
        whitespace is the reply's content if it called no tool, and dropped if it did."""
        rest, self.buffer = self.buffer, ""
        deltas = []
        if self.block is not None:
            deltas = self._read(rest)
            rest, more = self._close_block("")
            deltas += more
        content = self._content(rest)
        if not self.spoken and not self.calls:
            content, self.held = self.held, ""
        return content, deltas

    def _read(self, text: str) -> list[dict]:
        """The open block's new text -> the deltas of its call, if kept."""
        return [d for d in self.block.feed(text) if self._kept(d["index"])]

    def _close_block(self, tag: str) -> tuple[str, list[dict]]:
        """The open block ends (at its closing ``tag``, or with the reply) -> (content, last deltas)."""
        block, self.block = self.block, None
        call = next((c for c in block.calls if c.announced), None)
        if call is None:  # it named no function: it was text
            return OPEN + block.text + tag, []
        self.calls += 1
        if call.args_start is None and block.done and self._kept(call.index):
            return "", [{"index": call.index, "function": {"arguments": "{}"}}]  # a whole call without arguments
        return "", []

    def _kept(self, index: int) -> bool:
        return self.limit is None or index < self.limit

    def _content(self, text: str) -> str:
        if self.spoken:
            return text
        self.held += text
        if not self.held.strip():
            return ""
        self.spoken = True
        text, self.held = self.held, ""
        return text


def partial_tag_length(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` could be the start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def reply_tool_calls(text: str, tool_choice, parse_auto: bool, parallel: bool = True) -> tuple[str | None, list[dict]]:
    """A whole reply -> (content, tool calls)."""
    if tool_choice == "required" or isinstance(tool_choice, dict):
        calls = forced_calls(text, tool_choice)
        return (None if calls else text), calls
    if parse_auto and tool_choice == "auto":
        content, calls = parse_hermes(text, parallel)
        return (content if calls else text), calls
    return text, []


def tool_finish_reason(reason: str | None, called: bool, tool_choice) -> str | None:
    """"tool_calls" for a reply that stopped having called tools; a named choice keeps "stop", as OpenAI's does."""
    return "tool_calls" if reason == "stop" and called and not isinstance(tool_choice, dict) else reason


class ToolStream:
    """One streamed choice's tool calls: feed it text deltas, get (content delta, tool-call deltas). A named
    function's arguments stream as they come; "required" calls stream each from its name on
    (``JsonCallsReader``); "auto" reads Hermes blocks the same way (``HermesStream``)."""

    def __init__(self, tool_choice, parse_auto: bool, parallel: bool = True) -> None:
        self.choice = tool_choice
        self.named = isinstance(tool_choice, dict)
        self.hermes = HermesStream(limit=None if parallel else 1) if parse_auto and tool_choice == "auto" else None
        self.required = JsonCallsReader() if tool_choice == "required" else None
        self.called = False

    @property
    def active(self) -> bool:
        return self.named or self.choice == "required" or self.hermes is not None

    def feed(self, text: str) -> tuple[str, list[dict]]:
        if self.named:
            deltas = []
            if not self.called:
                self.called = True
                first = tool_call(self.choice["function"]["name"], "", index=0)
                deltas.append(first)
            if text:
                deltas.append({"index": 0, "function": {"arguments": text}})
            return "", deltas
        if self.required is not None:
            deltas = self.required.feed(text)
            self.called |= bool(deltas)
            return "", deltas
        content, deltas = self.hermes.feed(text)
        self.called |= bool(deltas)
        return content, deltas

    def finish(self) -> tuple[str, list[dict]]:
        if self.named:
            return "", []
        if self.required is not None:
            return ("" if self.called else self.required.text), []  # no call named: the text is the reply
        content, deltas = self.hermes.finish()
        self.called |= bool(deltas)
        return content, deltas

    def finish_reason(self, reason: str | None) -> str | None:
        return tool_finish_reason(reason, self.called, self.choice)
