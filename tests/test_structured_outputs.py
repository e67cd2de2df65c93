"""Structured outputs and tool calls: every kind of grammar offline, the same outputs under async scheduling,
chunked prefill, preemption and n > 1 as in the plain engine; then through the server with the real openai
client (20 random bounded JSON schemas, tool_choice required / named / auto, streamed and not), logprobs past a
grammar, the 400s, and LangChain's with_structured_output and bind_tools. The model's weights are random: only the
grammar makes its output valid."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys

import httpx
import jsonschema
import pytest

from raygrid import LLM, SamplingParams
from raygrid.engine.sampling_params import StructuredOutputsParams as Structured
from raygrid.engine.structured_output import GRAMMAR_SWITCH_INTERVAL_S, grammar_threads
from tests.conftest import random_prompts

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "bb", "ccc"]}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'
GRAMMARS = [
    (Structured(json=PERSON), lambda text, done: jsonschema.validate(json.loads(text), PERSON) or True),
    # Any object: unbounded (its keys are free strings), so random weights may run out of tokens; a cut one is an open object.
    (Structured(json_object=True), lambda text, done: isinstance(json.loads(text), dict) if done else text.startswith('{"')),
    (Structured(regex=r"[a-z]{2,5}-[0-9]{2}"), lambda text, done: re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", text)),
    (Structured(choice=["red", "green", "blue"]), lambda text, done: text in ("red", "green", "blue")),
    (Structured(grammar=LARK), lambda text, done: re.fullmatch(r"\([0-9]{1,3}(,[0-9]{1,3})*\)", text)),
]


def run_all(qwen3_dir, prompts, params, **engine):
    """The outputs, the engine's stats, and the process's GIL switch interval while the engine ran and after it
    shut down (the engine still referenced)."""
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=192, **engine)
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        stats, running = llm.get_stats(), sys.getswitchinterval()
    finally:
        llm.shutdown()
    return outputs, stats, (running, sys.getswitchinterval())


def test_every_grammar_kind_holds_and_async_chunking_preemption_and_n_change_nothing(qwen3_dir, tokenizer):
    prompts = random_prompts(len(GRAMMARS) + 2, len(tokenizer), min_len=20, max_len=60, seed=5)
    params = [SamplingParams(n=2, temperature=1.0, seed=10 + i, max_tokens=120, structured_outputs=s) for i, (s, _) in enumerate(GRAMMARS)]
    params.append(SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=40, ignore_eos=True))  # unconstrained, in the same batches
    # A grammar completed by the last token max_tokens allows: "stop" (the grammar's verdict comes first), in every mode.
    params.append(SamplingParams(max_tokens=1, structured_outputs=Structured(choice=["a"])))
    plain, _, _ = run_all(qwen3_dir, prompts, params, async_scheduling=False)
    modes, stats, _ = run_all(qwen3_dir, prompts, params, async_scheduling=True, max_num_batched_tokens=24, num_kv_blocks=26,
                           block_size=8)
    for (spec, valid), out in zip(GRAMMARS, plain):
        for completion in out.outputs:
            assert completion.finish_reason == "stop" or spec.json_object, (completion.text, completion.finish_reason)
            assert valid(completion.text, completion.finish_reason == "stop"), (spec, completion.text)
    for a, b in zip(plain, modes):
        assert [(c.token_ids, c.finish_reason) for c in a.outputs] == [(c.token_ids, c.finish_reason) for c in b.outputs]
    assert (plain[-1].outputs[0].text, plain[-1].outputs[0].finish_reason) == ("a", "stop")
    assert stats.num_preemptions > 0
    # Two samples of one schema differ (n > 1 draws each child on its own), and an unconstrained request
    # beside the constrained ones is not constrained.
    assert plain[0].outputs[0].text != plain[0].outputs[1].text
    assert len(plain[-2].outputs[0].token_ids) == 40


def test_async_scheduling_with_only_grammar_requests(qwen3_dir, tokenizer):
    """Every request under a grammar, all sampling from the first step: under async scheduling the first
    step has no step before it to wait for, and each later one holds its sampling for the one before."""
    prompts = random_prompts(3, len(tokenizer), min_len=3, max_len=8, seed=6)
    params = SamplingParams(temperature=1.0, seed=2, max_tokens=30, structured_outputs=Structured(regex="[a-z]{5,30}"))
    interval = sys.getswitchinterval()
    runs = {mode: run_all(qwen3_dir, prompts, params, async_scheduling=mode) for mode in (False, True)}
    outputs = {mode: run[0] for mode, run in runs.items()}
    # While an engine had a grammar thread, the GIL switched at 0.2 ms (that thread waits for it between
    # llguidance's calls); each engine's shutdown gave back the interpreter's own value.
    assert GRAMMAR_SWITCH_INTERVAL_S == 0.0002 != interval
    for running, after_shutdown in (run[2] for run in runs.values()):
        assert (running, after_shutdown) == (pytest.approx(GRAMMAR_SWITCH_INTERVAL_S), interval)
    for a, b in zip(outputs[False], outputs[True]):
        # (The text is the output tokens' own: a random prompt may end inside a character, which the first output text completes.)
        assert a.error is None and b.error is None and re.fullmatch("[a-z]{5,30}", tokenizer.decode(a.outputs[0].token_ids))
        assert a.outputs[0].token_ids == b.outputs[0].token_ids


def test_grammar_threads_sets_how_many_threads_fill_the_masks():
    """RAYGRID_GRAMMAR_THREADS=N gives llguidance's executor N threads (counted in a fresh interpreter, where
    nothing else starts threads meanwhile); a value that is not a positive whole number stops the engine's start
    (its import of the grammar module) with an error that names the variable."""
    count = (
        "import os; from raygrid.engine.structured_output import GrammarThread\n"
        "before = len(os.listdir('/proc/self/task')); work = GrammarThread(vocab_size=64, max_rows=2)\n"
        "print(len(os.listdir('/proc/self/task')) - before); work.shutdown()"
    )

    def run(value: str, code: str = count) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "RAYGRID_GRAMMAR_THREADS": value})

    for value in ("1", "3"):
        done = run(value)
        assert done.returncode == 0 and done.stdout.split()[-1] == value, (value, done.stdout, done.stderr[-2000:])
    for bad in ("0", "four"):
        done = run(bad, "import raygrid.engine.structured_output")
        assert done.returncode != 0 and f"RAYGRID_GRAMMAR_THREADS must be a whole number of at least 1, not '{bad}'" in done.stderr
    assert "RAYGRID_GRAMMAR_THREADS" not in os.environ and grammar_threads() is None  # unset: llguidance's default


def test_a_bad_grammar_is_refused_by_name_and_the_engine_carries_on(qwen3_dir):
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    try:
        for bad, words in ((Structured(regex="(unclosed"), "structured_outputs.regex does not compile: at 1(8): invalid regex "
                                                           '"(unclosed" (in regex): regex parse error: unclosed group'),
                           (Structured(grammar="start: undefined_rule"), "structured_outputs.grammar"),
                           (Structured(json={"type": "object", "properties": {"x": {"$ref": "#/nowhere"}}}), "structured_outputs.json"),
                           (Structured(regex="a" * 70_000), "the limit is 65536")):
            (refused,) = llm.generate("hi", SamplingParams(structured_outputs=bad), use_tqdm=False)
            assert refused.error and words in refused.error and not refused.outputs, refused.error
        with pytest.raises(ValueError, match="exactly one of"):
            Structured(regex="a", choice=["b"])
        (ok,) = llm.generate("hi", SamplingParams(max_tokens=8, structured_outputs=Structured(choice=["yes", "no"])), use_tqdm=False)
        assert ok.outputs[0].text in ("yes", "no")
    finally:
        llm.shutdown()


def fuzzed_schema(rng: random.Random, depth: int = 0):
    """A random, often invalid, JSON-schema-like value: wrong types, bad refs and patterns, absurd bounds."""
    if depth > 3 or rng.random() < 0.2:
        return rng.choice([True, False, None, 7, "string", [], {"type": rng.choice(["string", "integer", "nope", 3])}])
    schema = {}
    for _ in range(rng.randint(1, 5)):
        key = rng.choice(["type", "properties", "items", "anyOf", "allOf", "oneOf", "$ref", "pattern", "minLength", "maxLength",
                          "enum", "const", "minimum", "maximum", "required", "additionalProperties", "format", "minItems", "maxItems"])
        schema[key] = {
            "type": lambda: rng.choice(["object", "array", "string", "integer", "number", "boolean", "null", "nope", ["string", "null"]]),
            "properties": lambda: {f"k{i}": fuzzed_schema(rng, depth + 1) for i in range(rng.randint(0, 4))},
            "items": lambda: fuzzed_schema(rng, depth + 1),
            "$ref": lambda: rng.choice(["#", "#/properties/k0", "#/$defs/none", "http://x/y", "##"]),
            "pattern": lambda: rng.choice(["(", "[a-z]{2,}", "a{99999}", "(a|b)*c", ".*", "\\", "(?=x)"]),
            "required": lambda: rng.choice([["k0"], ["zz"], "k0", []]),
            "format": lambda: rng.choice(["email", "date-time", "uuid", "bogus"]),
        }.get(key, lambda: rng.choice([[fuzzed_schema(rng, depth + 1) for _ in range(rng.randint(0, 3))], -5, 0, 3, 10**12, "x", 2.5]))()
    return schema


def test_fuzzed_schemas_get_an_answer_and_leave_the_compiler_working(qwen3_dir):
    """300 random schemas (most of them invalid) through the input processor's check: each compiles or is refused with
    GrammarError naming the field, none stalls the compile pool, and a plain schema still compiles at once after.
    A compile over the time limit is refused by name."""
    from raygrid.engine.structured_output import GrammarCompiler, GrammarError
    from raygrid.models.loader import load_hf_config

    compiler = GrammarCompiler(qwen3_dir, load_hf_config(qwen3_dir).vocab_size, [2])
    rng = random.Random(7)
    try:
        assert compiler.tokenizer is not None  # built first (about a second), outside the compiles' time limits
        refused = 0
        for _ in range(300):
            schema = fuzzed_schema(rng)
            try:
                compiler.check(Structured(json=schema if isinstance(schema, dict) else {"anyOf": [schema]}), time_limit_s=10)
            except GrammarError as error:
                assert str(error).startswith("structured_outputs.json"), error
                refused += 1
        assert 50 < refused < 300  # many are nonsense, not all
        # About 25 ms of compiling (2,000 alternatives): a small regex compiled in the 1 us limit whenever the
        # loaded test machine paused this thread between handing it over and waiting for it.
        slow = "|".join(f"word{i}[a-z]{{2,5}}" for i in range(2000))
        with pytest.raises(GrammarError, match="structured_outputs.regex did not compile within 1e-06 s"):
            compiler.check(Structured(regex=slow), time_limit_s=1e-6)
        matcher = compiler.submit(Structured(json=PERSON)).result(timeout=30)
        assert not matcher.is_error()
    finally:
        compiler.shutdown()


def bounded_schema(rng: random.Random, depth: int = 0) -> dict:
    """A random JSON schema whose every instance is short: strings and arrays have maximum lengths."""
    kinds = ["string", "boolean", "integer", "enum", "array"] + (["object"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 8)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "integer":
        lo = rng.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
    if kind == "enum":
        return {"enum": rng.sample(["x", "yy", "zzz", "w w", "v"], rng.randint(1, 4))}
    if kind == "array":
        return {"type": "array", "items": bounded_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    props = {f"k{i}_{rng.randint(0, 99)}": bounded_schema(rng, depth + 1) for i in range(rng.randint(1, 4))}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                                                                           "unit": {"enum": ["c", "f"]}},
                                                           "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                                                            "required": ["zone"], "additionalProperties": False}}}


def streamed_calls(stream) -> tuple[dict[int, dict], str | None, str]:
    """Tool calls put together from streamed deltas, as the openai SDK's users do, the finish reason, and the content."""
    calls, finish, content = {}, None, ""
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return calls, finish, content


def strict_json(text: str):
    """JSON as RFC 8259 has it (and JavaScript's JSON.parse): no Infinity or NaN, which Python's json accepts."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def check_logprobs_past_the_grammar(base: str) -> None:
    """Logprobs read after a grammar's mask: more top logprobs asked for than the grammar allows tokens. The tokens
    it rules out are at -inf; the server writes them as vLLM does, -9999.0, in strict JSON (it answered 500 for the
    whole request, and null in streams, before). Completions and chat, streamed and not."""
    pick = {"model": "tiny", "max_tokens": 3, "guided_choice": ["yes", "no"]}
    bodies = {"/v1/completions": dict(pick, prompt="pick", logprobs=5),
              "/v1/chat/completions": dict(pick, messages=[{"role": "user", "content": "pick"}], logprobs=True, top_logprobs=5)}
    with httpx.Client(timeout=60) as http:
        for path, body in bodies.items():
            for stream in (False, True):
                response = http.post(f"{base}{path}", json=dict(body, stream=stream))
                assert response.status_code == 200, response.text
                if stream:
                    chunks = [strict_json(line.removeprefix("data: ")) for line in response.text.splitlines()
                              if line.startswith("data: {")]
                else:
                    chunks = [strict_json(response.text)]
                tops = []
                for chunk in chunks:
                    for choice in chunk["choices"]:
                        if path == "/v1/completions" and choice["logprobs"]:
                            tops += [list(top.values()) for top in choice["logprobs"]["top_logprobs"]]
                        elif path == "/v1/chat/completions" and choice["logprobs"]:
                            tops += [[top["logprob"] for top in entry["top_logprobs"]] for entry in choice["logprobs"]["content"]]
                assert tops and all(len(top) == 5 for top in tops), (path, stream, chunks)
                # The first token is one of "y" and "n" (two allowed: three ruled out); each logprob a number.
                assert all(isinstance(lp, float) and -9999.0 <= lp <= 0.0 for top in tops for lp in top), (path, stream, tops)
                assert sorted(lp == -9999.0 for lp in tops[0]) == [False, False, True, True, True], (path, stream, tops)


def check_requests_that_leave_no_token(base: str, tokenizer) -> None:
    """A request whose grammar allows none of its allowed_token_ids is the caller's error: a 400 (an
    invalid_request_error event in a stream, whose 200 went out first), not a 500; so is one whose bad_words ban all
    of its allowed_token_ids, refused before it runs (a 400 streamed or not)."""
    word = tokenizer.decode([77])
    grammar = {"model": "tiny", "prompt": "pick", "max_tokens": 3, "guided_choice": ["yes", "no"], "allowed_token_ids": [77]}
    banned = {"model": "tiny", "prompt": "pick", "max_tokens": 3, "bad_words": [word], "allowed_token_ids": [77]}
    with httpx.Client(timeout=60) as http:
        for body, stream, status, words in ((grammar, False, 400, "the grammar allows none of the tokens that allowed_token_ids leave"),
                                            (grammar, True, 200, "the grammar allows none of the tokens that allowed_token_ids leave"),
                                            (banned, False, 400, "allowed_token_ids: bad_words ban every one of them"),
                                            (banned, True, 400, "allowed_token_ids: bad_words ban every one of them")):
            response = http.post(f"{base}/v1/completions", json=dict(body, stream=stream))
            assert response.status_code == status, (body, stream, response.text)
            events = [strict_json(line.removeprefix("data: ")) for line in response.text.splitlines() if line.startswith("data: {")]
            error = (events[-1] if stream and status == 200 else strict_json(response.text))["error"]
            assert error["type"] == "invalid_request_error" and words in error["message"], (body, stream, response.text)


def test_required_tool_calls_stream_from_their_names_however_the_text_is_split():
    """A "required" reply (a JSON array of calls, as its grammar makes it) read as it streams: each call goes out when
    its name string closes, its arguments follow as written, and any split of the text, a reply cut anywhere
    included, gives what the whole reply gives, or a prefix of it."""
    from raygrid.entrypoints.tool_calls import JsonCallsReader, ToolStream, forced_calls, joined_calls

    text = ('[ {"name": "get_weather", "parameters": {"city": "O\\"slo }],", "days": [1, {"n": null}]}} ,\n'
            '{"parameters" : {"zone": "utc"}, "name": "get_\\u0074ime"}, {"name":"f","parameters":7}]')
    want = [("get_weather", '{"city": "O\\"slo }],", "days": [1, {"n": null}]}'), ("get_time", '{"zone": "utc"}'),
            ("f", "7")]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in forced_calls(text, "required")] == want
    assert [(c["name"], c["parameters"]) for c in json.loads(text)] == [(n, json.loads(a)) for n, a in want]

    reader, sent, named_at = JsonCallsReader(), [], {}
    for i, ch in enumerate(text):  # one character at a time
        for delta in reader.feed(ch):
            sent.append(delta)
            if "id" in delta:
                named_at[delta["index"]] = i
        args = "".join(d["function"]["arguments"] for d in sent if d["index"] == 0)
        assert want[0][1].startswith(args)
        if i == text.index('", "days"') - 1:  # a string's characters go out as they come, before it closes
            assert args == '{"city": "O\\"slo }],'
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in joined_calls(sent)] == want
    assert named_at[0] == text.index('get_weather"') + len("get_weather")  # the name goes out as it closes
    assert named_at[1] == text.index('ime"') + 3  # arguments written before the name wait for it
    assert all(set(d) == {"index", "id", "type", "function"} and d["function"]["arguments"] == "" for d in sent if "id" in d)

    rng = random.Random(0)
    for cut in range(len(text) + 1):  # cut short anywhere, and fed in random pieces
        reader, sent, at = JsonCallsReader(), [], 0
        while at < cut:
            step = rng.randint(1, 6)
            sent += reader.feed(text[at:min(at + step, cut)])
            at += step
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in joined_calls(sent)]
        assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in forced_calls(text[:cut], "required")]
        assert all(name == want[i][0] and want[i][1].startswith(args) for i, (name, args) in enumerate(calls)), (cut, calls)
        assert len(calls) == sum(cut > named for named in named_at.values())

    # The chat stream's view: no content while calls are named; a reply cut before any name is its text as content.
    stream = ToolStream("required", parse_auto=False)
    assert stream.feed(text[:20]) == ("", []) and stream.finish() == (text[:20], []) and stream.finish_reason("length") == "length"
    stream = ToolStream("required", parse_auto=False)
    content, deltas = stream.feed(text)
    assert content == "" and stream.finish() == ("", []) and stream.finish_reason("stop") == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in joined_calls(deltas)] == want


def test_hermes_tool_calls_stream_from_their_names_and_any_split_gives_the_whole_replys_parse():
    """"auto" with the hermes parser: a block's call goes out once its name is whole and its arguments as written
    (a JSON string of them decoded); a block that names no function is content; a whole call without arguments gets
    "{}"; one cut short keeps its arguments as far as they got. Fed in any pieces, the stream gives what the
    whole reply's parse gives, with parallel_tool_calls or without."""
    from raygrid.entrypoints.tool_calls import HermesStream, joined_calls, parse_hermes

    def calls(found):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in found]

    replies = {
        'Sure. <tool_call>\n{"name": "get_time", "arguments": {"zone": "u t\\"c"}}\n</tool_call>':
            ("Sure. ", [("get_time", '{"zone": "u t\\"c"}')]),
        '\n\n<tool_call>\n{"arguments": {"x": [1, "</"]}, "name": "a"}\n</tool_call>\n<tool_call>{"name": "b", '
        '"arguments": "{\\"y\\": 2}"}</tool_call>\n': (None, [("a", '{"x": [1, "</"]}'), ("b", '{"y": 2}')]),
        'text <tool_call>not json</tool_call> <tool_call>{"name": 5}</tool_call>':
            ('text <tool_call>not json</tool_call> <tool_call>{"name": 5}</tool_call>', []),
        '<tool_call>{"name": "n"}</tool_call><tool_call>{"name": "cut", "arguments": {"q": "ab':
            (None, [("n", "{}"), ("cut", '{"q": "ab')]),
    }
    rng = random.Random(0)
    for text, (content, want) in replies.items():
        assert parse_hermes(text)[0] == content and calls(parse_hermes(text)[1]) == want
        assert calls(parse_hermes(text, parallel=False)[1]) == want[:1]
        for limit in (None, 1):
            for _ in range(30):
                parser, streamed, deltas, at = HermesStream(limit=limit), "", [], 0
                while at < len(text):
                    step = rng.randint(1, 7)
                    piece, more = parser.feed(text[at:at + step])
                    streamed, deltas, at = streamed + piece, deltas + more, at + step
                piece, more = parser.finish()
                assert ((streamed + piece) or None, calls(joined_calls(deltas + more))) == (content, want[:limit])

    text, (_, (want_first,)) = next(iter(replies.items()))
    parser, named_at, args, start = HermesStream(), None, "", text.index('{"zone"')
    for i, ch in enumerate(text):  # one character at a time: the name as it closes, then the arguments as written
        for delta in parser.feed(ch)[1]:
            if "id" in delta:
                named_at = i
                assert delta["function"] == {"name": "get_time", "arguments": ""}
            else:
                args += delta["function"]["arguments"]
                assert args == text[start:i + 1]
    assert named_at == text.index('get_time"') + len("get_time") and args == want_first[1]


def test_server_json_schemas_tool_calls_and_langchain(qwen3_dir, tokenizer):
    import openai

    from tests.test_openai_server import start_server, stop_server

    proc, base = start_server(qwen3_dir, "--tool-call-parser", "hermes", "--max-model-len", "1024")  # tools make long prompts
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        user = [{"role": "user", "content": "answer in JSON"}]
        rng = random.Random(7)
        for i in range(20):  # every output parses and validates, although the weights are random
            schema = bounded_schema(rng)
            reply = client.chat.completions.create(model="tiny", messages=user, max_tokens=200, temperature=1.0, seed=i,
                                                   response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
            assert reply.choices[0].finish_reason == "stop", (schema, reply.choices[0].message.content)
            jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tiny", messages=user, max_tokens=200, stream=True, seed=1,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}) if c.choices)
        jsonschema.validate(json.loads(streamed), PERSON)
        picked = client.completions.create(model="tiny", prompt="pick", max_tokens=10, extra_body={"structured_outputs": {"choice": ["up", "down"]}})
        assert picked.choices[0].text in ("up", "down")
        coded = client.completions.create(model="tiny", prompt="code", max_tokens=10, extra_body={"guided_regex": "[A-F]{4}"})
        assert re.fullmatch("[A-F]{4}", coded.choices[0].text)
        check_logprobs_past_the_grammar(base)
        check_requests_that_leave_no_token(base, tokenizer)

        # Tools reach the template, and the history keeps an assistant's calls and the tool's answer.
        history = user + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "c"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "-3 and snow"}]
        with_tools = client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, TIME], tool_choice="none", max_tokens=1)
        text = tokenizer.apply_chat_template(history, tools=[WEATHER, TIME], add_generation_prompt=True, tokenize=False)
        assert with_tools.usage.prompt_tokens == len(tokenizer.encode(text, add_special_tokens=False))
        assert '"name": "get_time"' in text and "<tool_response>\n-3 and snow" in text and '"arguments": {"city": "Oslo"' in text
        assert not with_tools.choices[0].message.tool_calls

        # "required": one or more calls to the given tools, their arguments valid; streamed the same way.
        for seed in range(3):
            reply = client.chat.completions.create(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice="required",
                                                   max_tokens=200, seed=seed)
            choice = reply.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.tool_calls and choice.message.content is None
            for call in choice.message.tool_calls:
                tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
                jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        # Streamed, a call goes out once its name is whole and its arguments follow as written, in several deltas,
        # the same text as the reply that is not streamed. Cut short by max_tokens, the calls named so far come back,
        # the last one's arguments as far as they got, streamed or not.
        required = dict(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice="required", seed=0)
        whole = client.chat.completions.create(**required, max_tokens=200)
        whole_calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
        chunks = list(client.chat.completions.create(**required, max_tokens=200, stream=True))
        calls, finish, content = streamed_calls(chunks)
        assert finish == "tool_calls" and content == "" and [(c["name"], c["arguments"]) for c in calls.values()] == whole_calls
        first_call = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls
                      and c.choices[0].delta.tool_calls[0].index == 0]
        assert first_call[0].function.name == whole_calls[0][0] and first_call[0].function.arguments == ""
        assert len(first_call) >= 3 and all(d.function.name is None and d.id is None for d in first_call[1:])
        cut = whole.usage.completion_tokens - 3
        short = client.chat.completions.create(**required, max_tokens=cut)
        assert short.choices[0].finish_reason == "length" and short.choices[0].message.content is None
        short_calls = [(c.function.name, c.function.arguments) for c in short.choices[0].message.tool_calls]
        assert short_calls != whole_calls and all(
            name == whole_calls[i][0] and whole_calls[i][1].startswith(args) for i, (name, args) in enumerate(short_calls))
        calls, finish, _ = streamed_calls(client.chat.completions.create(**required, max_tokens=cut, stream=True))
        assert finish == "length" and [(c["name"], c["arguments"]) for c in calls.values()] == short_calls
        # A named function: its arguments, streamed as they are generated; finish_reason stays "stop", as OpenAI's.
        named = {"type": "function", "function": {"name": "get_weather"}}
        reply = client.chat.completions.create(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice=named, max_tokens=200, seed=4)
        (call,) = reply.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        calls, finish, _ = streamed_calls(client.chat.completions.create(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice=named,
                                                                          max_tokens=200, seed=4, stream=True))
        assert finish == "stop" and [(c["name"], c["arguments"]) for c in calls.values()] == [("get_weather", call.function.arguments)]
        # Cut short by max_tokens, the named call still comes back as the call, its arguments as far as they got
        # (as streamed, and as OpenAI does), not as content.
        cut = dict(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice=named, max_tokens=3, seed=4)
        reply = client.chat.completions.create(**cut)
        (short,) = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content is None
        assert short.function.name == "get_weather" and short.function.arguments != call.function.arguments
        assert short.function.arguments and call.function.arguments.startswith(short.function.arguments)
        calls, finish, _ = streamed_calls(client.chat.completions.create(**cut, stream=True))
        assert finish == "length" and [(c["name"], c["arguments"]) for c in calls.values()] == [("get_weather", short.function.arguments)]
        # "auto" with the hermes parser: a reply that writes a <tool_call> block (forced here by a regex, since the
        # weights are random) comes back as a tool call, streamed or not.
        block = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>'
        forced = dict(model="tiny", messages=user, tools=[WEATHER, TIME], max_tokens=60, extra_body={"guided_regex": "Sure\\. " + re.escape(block)})
        reply = client.chat.completions.create(**forced)
        assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content == "Sure. "
        assert [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls] == [("get_time", {"zone": "utc"})]
        calls, finish, content = streamed_calls(client.chat.completions.create(**forced, stream=True))
        assert finish == "tool_calls" and content == "Sure. " and [(c["name"], c["arguments"]) for c in calls.values()] == [
            ("get_time", '{"zone": "utc"}')]
        # parallel_tool_calls=false: one call. "auto" keeps the first of two blocks, streamed or not; "required" is
        # an array of one, although a bias toward "," makes the parallel reply add calls until max_tokens. The
        # whitespace around the blocks is no content, streamed or not.
        two = dict(forced, max_tokens=120, extra_body={"guided_regex": re.escape("\n\n" + block + "\n" + block.replace("utc", "cet"))})
        for parallel, want in ((True, [("get_time", {"zone": "utc"}), ("get_time", {"zone": "cet"})]), (False, [("get_time", {"zone": "utc"})])):
            reply = client.chat.completions.create(**two, parallel_tool_calls=parallel)
            assert [(c.function.name, json.loads(c.function.arguments)) for c in reply.choices[0].message.tool_calls] == want
            assert reply.choices[0].message.content is None
            calls, finish, content = streamed_calls(client.chat.completions.create(**two, parallel_tool_calls=parallel, stream=True))
            assert finish == "tool_calls" and [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == want
            assert content == ""
        commas = dict(model="tiny", messages=user, tools=[WEATHER, TIME], tool_choice="required", max_tokens=120, seed=0,
                      logit_bias={str(tokenizer.encode(",")[0]): 30})
        assert client.chat.completions.create(**commas).choices[0].finish_reason == "length"
        (single,) = client.chat.completions.create(**commas, parallel_tool_calls=False).choices[0].message.tool_calls
        jsonschema.validate(json.loads(single.function.arguments), {"get_weather": WEATHER, "get_time": TIME}[single.function.name]["function"]["parameters"])

        with httpx.Client(timeout=30) as http:
            chat = {"model": "tiny", "messages": user}
            for body, words in (
                (dict(chat, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/no"}}}}}),
                 "structured_outputs.json"),
                (dict(chat, structured_outputs={"regex": "(("}), "structured_outputs.regex does not compile: at 1(8): invalid regex "
                                                                '"((" (in regex): regex parse error: unclosed group'),
                (dict(chat, guided_grammar="x" * 70_000), "the limit is 65536"),
                (dict(chat, guided_choice=["a"], guided_regex="b"), "give one of"),
                (dict(chat, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "'nope', which is not among tools"),
                (dict(chat, tool_choice="required"), "needs tools"),
                (dict(chat, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}), "cannot be combined"),
                (dict(chat, structural_tag={"type": "structural_tag"}), "structural_tag"),
                (dict(chat, response_format={"type": "json_schema"}), "needs a json_schema"),
            ):
                response = http.post(f"{base}/v1/chat/completions", json=body)
                assert response.status_code == 400 and words in response.json()["error"]["message"], (body, response.text)
                if "does not compile" in words:  # found by the engine's compile, and still named
                    assert response.json()["error"]["param"] == "structured_outputs", response.text
            assert http.post(f"{base}/v1/chat/completions", json=dict(chat, max_tokens=3)).status_code == 200  # still serving

        # LangChain, through the same endpoints.
        from langchain_openai import ChatOpenAI
        from pydantic import BaseModel, Field

        class Pet(BaseModel):
            kind: str = Field(max_length=8)
            legs: int = Field(ge=0, le=8)

        chat_model = ChatOpenAI(base_url=f"{base}/v1", api_key="x", model="tiny", max_tokens=120, temperature=1.0, seed=3)
        pet = chat_model.with_structured_output(Pet, method="json_schema").invoke("describe a pet")
        assert isinstance(pet, Pet) and 0 <= pet.legs <= 8
        called = chat_model.bind_tools([WEATHER], tool_choice="required").invoke("weather in Oslo?")
        assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather" and set(called.tool_calls[0]["args"]) == {"city", "unit"}
    finally:
        stop_server(proc)


def letters_tokenizer():
    """A slow tokenizer of three letters: a transformers tokenizer in Python, with no Rust tokenizer behind it."""
    from transformers import PythonBackend

    class Letters(PythonBackend):
        def __init__(self):
            self.vocab = {c: i for i, c in enumerate("abc")}
            super().__init__()

        @property
        def vocab_size(self):
            return len(self.vocab)

        def get_vocab(self):
            return dict(self.vocab)

        def _tokenize(self, text):
            return list(text)

        def _convert_token_to_id(self, token):
            return self.vocab.get(token, 0)

        def _convert_id_to_token(self, index):
            return "abc"[index]

    return Letters()


def test_a_pickled_compiler_needs_no_transformers_and_an_idle_step_waits_for_grammars(qwen3_dir):
    """A Ray driver gets the front end's compiler pickled, with its tokenizer's JSON: in a fresh process it builds
    the same llguidance tokenizer and compiles without importing transformers or torch. And a scheduler with only
    grammars compiling blocks on them (``wait_for_grammars``) rather than letting the step loop spin: a spinning
    loop held the GIL that the compile thread needed, and a first grammar under Ray took 20 s instead of 3."""
    import pickle

    from transformers import AutoTokenizer

    from raygrid.engine.request import Request
    from raygrid.engine.structured_output import GrammarCompiler, GrammarError
    from tests.test_scheduler import make_request, make_scheduler

    compiler = GrammarCompiler(qwen3_dir, 1024, [2], hf_tokenizer=AutoTokenizer.from_pretrained(qwen3_dir))
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import pickle, sys\n"
             "from raygrid.engine.sampling_params import StructuredOutputsParams as S\n"
             "compiler = pickle.loads(sys.stdin.buffer.read())\n"
             "matcher = compiler.submit(S(regex='[a-z]{2,5}-[0-9]{2}')).result(timeout=60)\n"
             "print(matcher.is_error(), compiler.tokenizer.vocab_size, 'transformers' in sys.modules, 'torch' in sys.modules)"],
            input=pickle.dumps(compiler), capture_output=True, timeout=120)
        assert probe.stdout.decode().split() == ["False", "1024", "False", "False"], probe.stderr.decode()[-2000:]
        assert pickle.loads(pickle.dumps(compiler)).tokenizer_json() == compiler.tokenizer_json()
        padded = AutoTokenizer.from_pretrained(qwen3_dir)  # padding set: the JSON leaves it out, the caller keeps it
        padded.backend_tokenizer.enable_padding(length=8)
        assert GrammarCompiler(qwen3_dir, 1024, [2], hf_tokenizer=padded).tokenizer_json() == compiler.tokenizer_json()
        assert padded.backend_tokenizer.padding["length"] == 8
        # A slow (Python) tokenizer has no JSON: its compiler still pickles (a Ray engine starts), and the copy
        # refuses grammars by name, as the original does, without looking for a tokenizer of its own.
        slow = pickle.loads(pickle.dumps(GrammarCompiler("no-such-dir", 3, [0], hf_tokenizer=letters_tokenizer())))
        with pytest.raises(GrammarError, match="structured_outputs: the tokenizer of 'no-such-dir' is not a fast"):
            slow.check(Structured(choice=["ab"]))
        slow.shutdown()

        fresh = GrammarCompiler(qwen3_dir, 1024, [2])  # its tokenizer loads at the first compile: a good while
        try:
            def structured(req_id):
                return Request(req_id, [5, 6, 7], SamplingParams(max_tokens=4, structured_outputs=Structured(choice=["a", "b"])),
                               4, frozenset({2}))

            busy = make_scheduler(grammars=fresh)
            busy.add_request(make_request("plain", 3))
            busy.add_request(structured("s1"))
            busy.wait_for_grammars(timeout_s=60)  # a request is waiting to run: no wait
            assert not busy.requests["s1"].grammar_future.done()
            idle = make_scheduler(grammars=fresh)
            idle.add_request(structured("s2"))
            idle.wait_for_grammars(timeout_s=60)
            assert idle.requests["s2"].grammar_future.done()
        finally:
            fresh.shutdown()
    finally:
        compiler.shutdown()
