"""logit_bias, allowed_token_ids, bad_words and truncate_prompt_tokens, offline and through the server with
the real openai client; the server's 400 for a field raygrid does not implement; and its other vLLM routes
(/v1/models/{id}, /tokenize, /detokenize), CORS, x-request-id, `raygrid serve MODEL`, the Qwen3 reasoning
parser, the hermes tool-call stream, return_token_ids and add_special_tokens. (That async
scheduling, TP and PP compute the same for the sampling fields is in test_execution_modes.py and
test_distributed.py.)"""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    engine = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    yield engine
    engine.shutdown()


def tokens(llm, prompt, **params):
    base = dict(max_tokens=12, ignore_eos=True, temperature=0)
    return llm.generate({"prompt_token_ids": prompt}, SamplingParams(**{**base, **params}), use_tqdm=False)[0].outputs[0].token_ids


def test_logit_bias_allowed_tokens_bad_words_and_truncation(llm, tokenizer):
    prompt = random_prompts(1, len(tokenizer), seed=41)[0]
    plain = tokens(llm, prompt)
    assert tokens(llm, prompt, logit_bias={77: 100.0}) == [77] * 12
    assert tokens(llm, prompt, temperature=1.0, seed=3, logit_bias={77: 100.0}) == [77] * 12
    assert tokens(llm, prompt, logit_bias={plain[0]: -100.0})[0] != plain[0]
    allowed = [9, 99, 999]
    assert set(tokens(llm, prompt, temperature=1.5, seed=4, allowed_token_ids=allowed)) <= set(allowed)
    # A bad word of one token that greedy writes: never written. One of two tokens: its second token never
    # follows its first.
    single = next(t for t in plain if tokenizer.encode(tokenizer.decode([t]), add_special_tokens=False) == [t])
    assert single not in tokens(llm, prompt, bad_words=[tokenizer.decode([single])])
    pair = next(((a, b) for a, b in zip(plain, plain[1:]) if tokenizer.encode(tokenizer.decode([a, b]), add_special_tokens=False) == [a, b]), None)
    if pair is not None:
        out = tokens(llm, prompt, bad_words=[tokenizer.decode(list(pair))])
        assert not any((a, b) == pair for a, b in zip(out, out[1:]))
        assert out != plain
    # truncate_prompt_tokens keeps the prompt's last tokens.
    assert tokens(llm, prompt, truncate_prompt_tokens=5) == tokens(llm, prompt[-5:])


def test_bad_token_ids_are_refused_by_name(llm, tokenizer):
    prompt = {"prompt_token_ids": random_prompts(1, len(tokenizer), seed=42)[0]}
    for field, value in (("logit_bias", {10**6: 1.0}), ("allowed_token_ids", [10**6])):
        (out,) = llm.generate(prompt, SamplingParams(**{field: value}), use_tqdm=False)
        assert out.error and field in out.error and "outside [0, 1024)" in out.error
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=[" "])
    assert SamplingParams(logit_bias={1: 500.0}).logit_bias == {1: 100.0}  # clamped as OpenAI does


def test_server_logit_controls_unsupported_fields_and_routes(qwen3_dir, tokenizer):
    import openai

    from tests.test_openai_server import start_server, stop_server

    proc, base = start_server(qwen3_dir, "--allowed-origins", "http://app.example", "--reasoning-parser", "qwen3",
                              "--max-logprobs", "25", positional_model=True)
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        forced = client.completions.create(model="tiny", prompt="hello", max_tokens=5, logit_bias={"77": 100}, user="u-1",
                                           extra_body={"ignore_eos": True})
        assert forced.choices[0].text == tokenizer.decode([77] * 5)
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                              metadata={"team": "a"}, store=False, extra_body={"ignore_eos": True,
                                                                                             "allowed_token_ids": [77]})
        assert chat.choices[0].message.content == tokenizer.decode([77] * 4)
        # A token that holds part of a UTF-8 character: its text is U+FFFD, its bytes are its own.
        partial = next(i for i in range(len(tokenizer)) if tokenizer.decode([i]) == "\ufffd")
        forced = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                                logprobs=True, top_logprobs=2, logit_bias={str(partial): 100})
        (first,) = forced.choices[0].logprobs.content
        wide = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                              logprobs=True, top_logprobs=25)  # above OpenAI's 20
        assert len(wide.choices[0].logprobs.content[0].top_logprobs) == 25
        assert first.token == "\ufffd" and first.bytes == list(tokenizer.convert_ids_to_tokens(partial).encode("latin-1")) != [239, 191, 189]
        # (The top logprobs are the model's own, before the bias.) Whole tokens' bytes spell their text.
        assert all(bytes(top.bytes).decode("utf-8") == top.token for top in first.top_logprobs if top.token != "\ufffd")
        # echo: the prompt comes back first, with its tokens' logprobs (the first has none), as lm-eval's
        # loglikelihood tasks read them; max_tokens 0 generates nothing.
        prompt = "the quick brown fox jumps"
        prompt_ids = tokenizer.encode(prompt)
        scored = client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=2, max_tokens=0)
        choice = scored.choices[0]
        assert choice.text == prompt and scored.usage.completion_tokens == 0
        assert len(choice.logprobs.tokens) == len(prompt_ids) and "".join(choice.logprobs.tokens) == prompt
        assert choice.logprobs.token_logprobs[0] is None and all(lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
        offline = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
        try:
            truth = offline.generate(prompt, SamplingParams(max_tokens=1, prompt_logprobs=2), use_tqdm=False)[0].prompt_logprobs
        finally:
            offline.shutdown()
        assert all(abs(lp - truth[i][t].logprob) < 1e-4 for i, (t, lp) in enumerate(zip(prompt_ids, choice.logprobs.token_logprobs)) if i)
        # vLLM's prompt_logprobs field: per prompt token its own entry and the top k, the offline engine's; beside echo's
        # logprobs, each view keeps its own k; chat returns the rendered conversation's; a stream refuses it.
        for echo_k, k in ((None, 2), (2, 1)):
            echo = dict(echo=True, logprobs=echo_k) if echo_k else {}
            asked = client.completions.create(model="tiny", prompt=prompt, max_tokens=1, **echo,
                                              extra_body={"prompt_logprobs": k}).choices[0]
            assert asked.prompt_logprobs[0] is None and len(asked.prompt_logprobs) == len(prompt_ids)
            for i, (token_id, entry) in enumerate(zip(prompt_ids[1:], asked.prompt_logprobs[1:]), start=1):
                want = {str(t): lp for t, lp in truth[i].items() if lp.rank <= k or t == token_id}
                assert entry.keys() == want.keys() and str(token_id) in entry
                assert all(abs(entry[t]["logprob"] - lp.logprob) < 1e-4 and entry[t]["rank"] == lp.rank
                           and entry[t]["decoded_token"] == lp.decoded_token for t, lp in want.items())
            if echo_k:
                assert asked.logprobs.token_logprobs[: len(prompt_ids)] == choice.logprobs.token_logprobs
        chat_asked = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                                    extra_body={"prompt_logprobs": 0})
        assert len(chat_asked.prompt_logprobs) == chat_asked.usage.prompt_tokens and chat_asked.prompt_logprobs[0] is None
        assert all(len(entry) == 1 for entry in chat_asked.prompt_logprobs[1:])
        assert client.completions.create(model="tiny", prompt=prompt, max_tokens=1).choices[0].prompt_logprobs is None
        with pytest.raises(openai.BadRequestError, match="prompt_logprobs is not available with stream=true"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=1, stream=True, extra_body={"prompt_logprobs": 1})
        more = client.completions.create(model="tiny", prompt=prompt, echo=True, logprobs=1, max_tokens=3, extra_body={"ignore_eos": True})
        assert more.choices[0].text.startswith(prompt) and len(more.choices[0].logprobs.tokens) == len(prompt_ids) + 3
        assert more.choices[0].logprobs.token_logprobs[: len(prompt_ids)] == choice.logprobs.token_logprobs
        # Streamed, echo puts the prompt (and its logprobs) in each choice's first chunk; the whole equals the above.
        for body in (dict(max_tokens=3, extra_body={"ignore_eos": True}), dict(max_tokens=0)):
            body.update(model="tiny", prompt=prompt, echo=True, logprobs=1, temperature=0)
            whole = client.completions.create(**body)
            chunks = [c.choices[0] for c in client.completions.create(stream=True, **body) if c.choices]
            assert chunks[0].text.startswith(prompt) and "".join(c.text for c in chunks) == whole.choices[0].text
            assert [t for c in chunks for t in c.logprobs.tokens] == whole.choices[0].logprobs.tokens
            assert [o for c in chunks for o in c.logprobs.text_offset] == whole.choices[0].logprobs.text_offset
            assert [lp for c in chunks for lp in c.logprobs.token_logprobs] == whole.choices[0].logprobs.token_logprobs
            assert chunks[-1].finish_reason == whole.choices[0].finish_reason
        # text_offset is where each token starts in the choice's text. A character split over tokens (an emoji, or 'ö'
        # in byte-level BPE) is one character there, at one offset for all its pieces. (Summing the pieces' decoded
        # lengths, a U+FFFD each, drifted past the text, and the first completion offset after an echo went back.)
        wide = "héllo 😀 wörld 日本"
        for echo in (True, False):
            body = dict(model="tiny", prompt=wide, echo=echo, logprobs=1, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
            whole = client.completions.create(**body).choices[0]
            chunks = [c.choices[0] for c in client.completions.create(stream=True, **body) if c.choices]
            tokens, offsets, text = whole.logprobs.tokens, whole.logprobs.text_offset, whole.text
            assert [o for c in chunks for o in c.logprobs.text_offset] == offsets
            assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] < len(text)
            split = 0
            for token, offset in zip(tokens, offsets):
                head = token.split("\ufffd")[0]  # a piece of a character: the whole characters before it
                assert text[offset: offset + len(head)] == head, (token, offset, text)
                if head != token:
                    assert ord(text[offset + len(head)]) > 0x7F, (token, offset, text)
                    split += 1
            assert split >= (6 if echo else 0)
        # return_token_ids (vLLM's): each choice's token ids and its prompt's, whole and streamed (the prompt's in a
        # choice's first chunk); return_tokens_as_token_ids: logprobs name tokens 'token_id:N'.
        def extra(model, name):
            return (model.model_extra or {}).get(name)

        ids_body = dict(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=2,
                        extra_body={"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True})
        whole = client.completions.create(**ids_body).choices[0]
        assert extra(whole, "prompt_token_ids") == prompt_ids and len(extra(whole, "token_ids")) == 4
        assert tokenizer.decode(extra(whole, "token_ids"), skip_special_tokens=True) == whole.text
        assert whole.logprobs.tokens == [f"token_id:{t}" for t in extra(whole, "token_ids")]
        assert all(len(top) >= 2 and f"token_id:{t}" in top for t, top in zip(extra(whole, "token_ids"), whole.logprobs.top_logprobs))
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **ids_body) if c.choices]
        assert extra(chunks[0], "prompt_token_ids") == prompt_ids and not any(extra(c, "prompt_token_ids") for c in chunks[1:])
        assert [t for c in chunks for t in extra(c, "token_ids")] == extra(whole, "token_ids")
        assert [t for c in chunks for t in c.logprobs.tokens] == whole.logprobs.tokens
        plain = client.completions.create(model="tiny", prompt=prompt, max_tokens=2).choices[0]
        assert extra(plain, "token_ids") is None and extra(plain, "prompt_token_ids") is None
        chat_ids = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, n=2, temperature=1, seed=5,
                        logprobs=True, top_logprobs=1, extra_body={"ignore_eos": True, "return_token_ids": True,
                                                                   "return_tokens_as_token_ids": True})
        reply = client.chat.completions.create(**chat_ids)
        assert len(extra(reply, "prompt_token_ids")) == reply.usage.prompt_tokens
        for choice in reply.choices:
            assert [c.token for c in choice.logprobs.content] == [f"token_id:{t}" for t in extra(choice, "token_ids")]
            assert tokenizer.decode(extra(choice, "token_ids"), skip_special_tokens=True) == choice.message.content
        chunks = list(client.chat.completions.create(stream=True, **chat_ids))
        assert extra(chunks[0], "prompt_token_ids") == extra(reply, "prompt_token_ids")
        assert not any(extra(c, "prompt_token_ids") for c in chunks[1:])
        for choice in reply.choices:
            assert [t for c in chunks for ch in c.choices if ch.index == choice.index for t in extra(ch, "token_ids")] == extra(choice, "token_ids")
        assert extra(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1),
                     "prompt_token_ids") is None
        # truncate_prompt_tokens: a prompt past max_model_len (512) is taken, and echo, its logprobs, prompt_logprobs and
        # usage are those of the tokens the model read (the whole prompt's text and ids here made a 500, a KeyError).
        long_ids = [3 + (7 * i) % 400 for i in range(600)]
        cut = dict(model="tiny", prompt=long_ids, max_tokens=2, temperature=0, echo=True, logprobs=1,
                   extra_body={"truncate_prompt_tokens": 3, "ignore_eos": True})
        kept = client.completions.create(**cut, stream=False)
        alone = client.completions.create(**dict(cut, prompt=long_ids[-3:], extra_body={"ignore_eos": True}))
        assert kept.usage.prompt_tokens == 3 and kept.choices[0].text == alone.choices[0].text
        assert kept.choices[0].text.startswith(tokenizer.decode(long_ids[-3:])) and len(kept.choices[0].logprobs.tokens) == 5
        assert kept.choices[0].logprobs.token_logprobs == alone.choices[0].logprobs.token_logprobs
        chunks = [c.choices[0] for c in client.completions.create(**cut, stream=True) if c.choices]
        assert "".join(c.text for c in chunks) == kept.choices[0].text
        with_prompt_logprobs = client.completions.create(**dict(cut, extra_body={"truncate_prompt_tokens": 3, "prompt_logprobs": 0}))
        assert [next(iter(e)) for e in with_prompt_logprobs.choices[0].prompt_logprobs[1:]] == [str(t) for t in long_ids[-2:]]
        chat_cut = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi " * 600}], max_tokens=1,
                                                  extra_body={"truncate_prompt_tokens": 4})
        assert chat_cut.usage.prompt_tokens == 4
        # The reasoning parser: a reply that does not think is all content; a prompt that opens the thinking
        # (a template ending in <think>) makes a reply with no </think> all reasoning, streamed or not.
        assert chat.choices[0].message.reasoning_content is None
        thinking = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                        extra_body={"ignore_eos": True, "chat_template": "{{ messages[0]['content'] }}<think>\n"})
        whole = client.chat.completions.create(**thinking, temperature=0)
        assert whole.choices[0].message.reasoning_content and whole.choices[0].message.content == ""
        parts = [c.choices[0].delta for c in client.chat.completions.create(**thinking, temperature=0, stream=True) if c.choices]
        assert "".join(getattr(d, "reasoning_content", None) or "" for d in parts) == whole.choices[0].message.reasoning_content
        assert "".join(d.content or "" for d in parts) == ""
        with httpx.Client(timeout=30) as http:
            user = [{"role": "user", "content": "x"}]
            for path, body, message, param in (  # the error's message, whole or its start, and the field at fault
                ("completions", {"prompt": "x", "toolz": 1}, "toolz: is not supported by raygrid", "toolz"),
                # tool_choice "auto" (the default with tools) needs --tool-call-parser, which this server lacks
                ("chat/completions", {"messages": user, "tools": [{"type": "function", "function": {"name": "f"}}]},
                 "tool_choice 'auto' (the default with tools) needs the server started with --tool-call-parser", "tool_choice"),
                ("chat/completions", {"messages": user, "tools": [{"type": "function", "function": {"name": "f"}}],
                                      "tool_choice": {"type": "function", "function": {"name": "g"}}},
                 "tool_choice names function 'g', which is not among tools", "tool_choice"),
                ("completions", {"prompt": "x", "suffix": "y"}, "suffix is not supported", "suffix"),
                *(("completions", {"prompt": bad}, "prompt: must be a string, a list of strings, a list of token ids or a list "
                                                   "of token-id lists", "prompt") for bad in (["a", 5], [1.5, 2], [[1], "a"], [True], 7)),
                ("completions", {"prompt": "x", "stream_options": {"include_usage": True}},
                 "stream_options is only allowed with stream=true", "stream_options"),
                ("completions", {"prompt": "x", "best_of": 3}, "best_of (3) is not supported", "best_of"),
                ("completions", {"prompt": "x", "logit_bias": {"not-a-token": 1}}, "logit_bias keys must be token ids", "logit_bias"),
                ("completions", {"prompt": "x", "min_tokens": 5, "max_tokens": 3}, "min_tokens (5) must be <= max_tokens (3)", "min_tokens"),
                ("chat/completions", {"messages": user, "max_completion_tokens": 0},
                 "max_completion_tokens: Input should be greater than or equal to 1", "max_completion_tokens"),
                ("chat/completions", {"messages": user, "top_logprobs": 2}, "top_logprobs requires logprobs to be true", "top_logprobs"),
                # the server's --max-logprobs is the limit (25 here; OpenAI's 20 is not)
                ("chat/completions", {"messages": user, "logprobs": True, "top_logprobs": 26},
                 "logprobs (26) must be <= max_logprobs (25)", "logprobs"),
                ("completions", {"prompt": "x", "logprobs": 26}, "logprobs (26) must be <= max_logprobs (25)", "logprobs"),
                ("chat/completions", {"messages": [{"role": "user"}]}, "messages.0: a user message needs content", "messages.0"),
                # Fields of several types: one problem a field, not one a type under the type's name.
                ("chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]},
                 "messages.0.content: content parts of type 'image_url' are not supported (only 'text')", "messages.0.content"),
                ("chat/completions", {"messages": user, "stop": 5}, "stop: input should be a valid string or a valid list (got 5)", "stop"),
                # vLLM's older guided_* fields are named as the client sent them, not as the field they become.
                ("completions", {"prompt": "x", "guided_choice": []}, "guided_choice: list should have at least 1 item", "guided_choice"),
                ("completions", {"prompt": "x", "guided_json": "{bad"}, "guided_json: is not valid JSON", "guided_json"),
                ("chat/completions", {"messages": user, "tool_choice": {"type": "function", "function": {}}},
                 "tool_choice.function.name: Field required", "tool_choice.function.name"),
            ):
                response = http.post(f"{base}/v1/{path}", json=dict(body, model="tiny"))
                assert response.status_code == 400, (body, response.text)
                error = response.json()["error"]
                assert message in error["message"] and (param is None or error["param"] == param), error
            # The other routes.
            card = http.get(f"{base}/v1/models/tiny").json()
            assert card["id"] == "tiny" and card["root"] == str(qwen3_dir)  # the positional MODEL was served
            missing = http.get(f"{base}/v1/models/other")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
            counted = http.post(f"{base}/tokenize", json={"model": "tiny", "prompt": "hello world"}).json()
            assert counted["tokens"] == tokenizer.encode("hello world") and counted["count"] == len(counted["tokens"])
            chat_ids = http.post(f"{base}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
            assert tokenizer.decode(chat_ids).endswith("<|im_start|>assistant\n")
            assert http.post(f"{base}/detokenize", json={"tokens": counted["tokens"]}).json() == {"prompt": "hello world"}
            assert http.post(f"{base}/detokenize", json={"tokens": [10**6]}).status_code == 400
            assert http.post(f"{base}/tokenize", json={"prompt": "x", "messages": []}).status_code == 400
            # A conversation with tools, an earlier call and its answer, and template kwargs: the count is the chat
            # route's (before, /tokenize dropped the calls and took neither tools nor template kwargs).
            tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}}}}}]
            calling = [user[0], {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}, {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
            rendering = {"messages": calling, "tools": tools, "chat_template_kwargs": {"enable_thinking": False}}
            counted = http.post(f"{base}/tokenize", json=dict(rendering, return_token_strs=True)).json()
            chat = http.post(f"{base}/v1/chat/completions", json=dict(rendering, model="tiny", max_tokens=1, tool_choice="none")).json()
            assert counted["count"] == chat["usage"]["prompt_tokens"]
            assert counted["token_strs"] == tokenizer.convert_ids_to_tokens(counted["tokens"])
            assert "get_weather" in tokenizer.decode(counted["tokens"]) and "Paris" in tokenizer.decode(counted["tokens"])
            refused = http.post(f"{base}/tokenize", json={"prompt": "x", "tools": tools})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"  # not silently ignored
            # continue_final_message (vLLM's): the last message left open, in the chat and in its count.
            begun = {"messages": [user[0], {"role": "assistant", "content": "Sure, the answer is"}],
                     "add_generation_prompt": False, "continue_final_message": True}
            open_ids = http.post(f"{base}/tokenize", json=begun).json()["tokens"]
            assert tokenizer.decode(open_ids).endswith("<|im_start|>assistant\nSure, the answer is")
            chat = http.post(f"{base}/v1/chat/completions", json=dict(begun, model="tiny", max_tokens=1)).json()
            assert chat["usage"]["prompt_tokens"] == len(open_ids)
            # echo (vLLM's): the reply's content starts with the last message's where the assistant wrote it, streamed
            # too; a conversation that ends with the user's message has nothing to echo.
            greedy_body = dict(begun, model="tiny", max_tokens=4, temperature=0, ignore_eos=True)
            generated = http.post(f"{base}/v1/chat/completions", json=greedy_body).json()["choices"][0]["message"]["content"]
            echoed = http.post(f"{base}/v1/chat/completions", json=dict(greedy_body, echo=True)).json()["choices"][0]["message"]["content"]
            assert generated and echoed == "Sure, the answer is" + generated
            events = [line[6:] for line in http.post(f"{base}/v1/chat/completions", json=dict(greedy_body, echo=True, stream=True)).text.splitlines()
                      if line.startswith("data: {")]
            assert "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events) == echoed
            user_last = dict(greedy_body, messages=user, add_generation_prompt=True, continue_final_message=False)
            assert (http.post(f"{base}/v1/chat/completions", json=dict(user_last, echo=True)).json()["choices"][0]["message"]["content"]
                    == http.post(f"{base}/v1/chat/completions", json=user_last).json()["choices"][0]["message"]["content"])
            for route, body in (("v1/chat/completions", dict(begun, model="tiny", add_generation_prompt=True)),
                                ("tokenize", dict(begun, add_generation_prompt=True))):
                refused = http.post(f"{base}/{route}", json=body)
                assert refused.status_code == 400 and refused.json()["error"]["param"] == "continue_final_message", refused.text
            # x-request-id: the caller's, or a fresh one.
            assert http.get(f"{base}/v1/models", headers={"x-request-id": "abc"}).headers["x-request-id"] == "abc"
            assert len(http.get(f"{base}/v1/models").headers["x-request-id"]) == 32
            # The response's id, as vLLM makes it: the X-Request-Id header, else the body's request_id, after the route's
            # prefix. Requests in flight together under one id are still each their own request in the engine.
            hi = [{"role": "user", "content": "hi"}]
            assert client.chat.completions.create(model="tiny", messages=hi, max_tokens=2,
                                                  extra_body={"request_id": "trace-7"}).id == "chatcmpl-trace-7"
            assert {c.id for c in client.chat.completions.create(model="tiny", messages=hi, max_tokens=2, stream=True,
                                                                 extra_body={"request_id": "trace-7"})} == {"chatcmpl-trace-7"}
            assert client.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": "hdr-1"},
                                             extra_body={"request_id": "body-1"}).id == "cmpl-hdr-1"
            assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).id.startswith("cmpl-")
            prompts = [[5 + i] * (3 + i) for i in range(4)]
            greedy = dict(model="tiny", max_tokens=6, temperature=0, extra_body={"ignore_eos": True, "request_id": "same"})
            alone = [client.completions.create(prompt=p, **greedy).choices[0].text for p in prompts]
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                together = list(pool.map(lambda p: client.completions.create(prompt=p, **greedy), prompts))
            assert [r.choices[0].text for r in together] == alone and {r.id for r in together} == {"cmpl-same"}
            for bad in ("", "x" * 257):
                refused = http.post(f"{base}/v1/completions", json=dict(model="tiny", prompt="hi", request_id=bad))
                assert refused.status_code == 400 and refused.json()["error"]["param"] == "request_id", refused.text
            # CORS: a browser's preflight from the allowed origin is answered; another origin gets no grant.
            preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
            answer = http.options(f"{base}/v1/completions", headers=preflight)
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "http://app.example"
            other = http.options(f"{base}/v1/completions", headers=dict(preflight, Origin="http://evil.example"))
            assert "access-control-allow-origin" not in other.headers
    finally:
        stop_server(proc)




REPLIES = [
    "<think>\nweigh it up</think>\n\nthe answer",
    "  <think>short</think>answer with </th and <thi inside",
    "no thinking here, just < and <th text",
    "<think>cut off before the end",
    "<thi",
]


@pytest.mark.parametrize("reply", REPLIES)
@pytest.mark.parametrize("prompt_opened", [False, True])
def test_reasoning_stream_splits_as_the_whole_reply_at_every_cut(reply, prompt_opened):
    """Streamed in pieces of every size, the Qwen3 parser sends what it gives for the whole reply."""
    from raygrid.entrypoints.reasoning import Qwen3ReasoningParser

    parser = Qwen3ReasoningParser()
    whole_reasoning, whole_content = parser.split(reply, prompt_opened)
    for size in range(1, len(reply) + 1):
        stream = parser.stream(prompt_opened)
        reasoning = content = ""
        for start in range(0, len(reply), size):
            r, c = stream.feed(reply[start:start + size])
            reasoning, content = reasoning + r, content + c
        r, c = stream.finish()
        reasoning, content = reasoning + r, content + c
        assert (reasoning or None, content) == (whole_reasoning or None, whole_content), size
    if not prompt_opened:
        expected = {REPLIES[0]: ("weigh it up", "the answer"), REPLIES[1]: ("short", "answer with </th and <thi inside"),
                    REPLIES[2]: (None, REPLIES[2]), REPLIES[3]: ("cut off before the end", ""), REPLIES[4]: (None, "<thi")}
        assert (whole_reasoning, whole_content) == expected[reply]


CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
TOOL_REPLIES = {  # reply -> (content, calls) of the whole reply
    "Sure. " + CALL: ("Sure. ", 1),
    "\n\n" + CALL + "\n" + CALL + "\n": (None, 2),  # whitespace around the blocks is no content
    "\n\n" + CALL + " then some": ("\n\n then some", 1),
    "  just text, <tool and <tool_cal": ("  just text, <tool and <tool_cal", 0),
    "\n \n": ("\n \n", 0),  # a reply of whitespace, and no call, is its content
    "<tool_call>not json</tool_call> " + CALL: ("<tool_call>not json</tool_call> ", 1),
    "\n" + CALL[: -len("</tool_call>")]: (None, 1),  # an unclosed block whose JSON is whole
}


@pytest.mark.parametrize("reply", TOOL_REPLIES)
def test_tool_call_stream_splits_as_the_whole_reply_at_every_cut(reply):
    """Streamed in pieces of every size, the hermes parser sends the content and calls of the whole reply (the whole
    reply's content was stripped, the stream's not), each call in deltas that a client puts together."""
    from raygrid.entrypoints.tool_calls import HermesStream, joined_calls, parse_hermes

    content, calls = parse_hermes(reply)
    assert (content, len(calls)) == TOOL_REPLIES[reply]
    for size in range(1, len(reply) + 1):
        stream, sent, got = HermesStream(), "", []
        for start in range(0, len(reply), size):
            c, new = stream.feed(reply[start:start + size])
            sent, got = sent + c, got + new
        c, new = stream.finish()
        sent, got = sent + c, got + new
        assert (sent or None, [(g["function"]["name"], g["function"]["arguments"]) for g in joined_calls(got)]) == (
            content, [(g["function"]["name"], g["function"]["arguments"]) for g in calls]), size


def test_server_uses_the_checkpoints_generation_defaults(qwen3_dir, tmp_path):
    """As vLLM: a request that leaves temperature, top_k or top_p out gets generation_config.json's values
    (seeded, the omitted fields draw what the same values sent explicitly draw, and not what the API defaults draw)."""
    import json
    import shutil

    import openai

    from tests.test_openai_server import start_server, stop_server

    copy = tmp_path / "with_defaults"
    shutil.copytree(qwen3_dir, copy)
    generation = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps(dict(generation, temperature=0.3, top_k=5)))
    proc, base = start_server(str(copy))
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")

        def text(**extra):
            out = client.completions.create(model="tiny", prompt="one two three", max_tokens=12, seed=7,
                                            extra_body={"ignore_eos": True, **extra})
            return out.choices[0].text

        omitted = text()
        assert omitted == text(temperature=0.3, top_k=5)
        assert omitted != text(temperature=1.0, top_k=0)
    finally:
        stop_server(proc)


def test_add_special_tokens_on_both_routes_and_tokenize_with_a_tokenizer_that_adds_a_bos(qwen3_dir, tmp_path):
    """As vLLM: completions tokenize a text prompt with the tokenizer's special tokens (a BOS here) unless
    add_special_tokens is false; chat sends the template's text without them unless it is true; /tokenize counts what
    each route sends. Under echo, the prompt's BOS (not in its text) takes no room in text_offset."""
    import shutil

    import openai
    from transformers import AutoTokenizer

    from tests.test_openai_server import start_server, stop_server

    model = tmp_path / "bos"
    shutil.copytree(qwen3_dir, model)
    spec = json.loads((model / "tokenizer.json").read_text())
    bos = [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}]
    spec["post_processor"] = {"type": "TemplateProcessing", "single": bos + [{"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": bos + [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}}}
    (model / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = AutoTokenizer.from_pretrained(model)
    text, messages = "hello there", [{"role": "user", "content": "hello there"}]
    plain = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.encode(text) == [0] + plain
    proc, base = start_server(str(model))
    try:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")

        def completion_ids(**extra):
            reply = client.completions.create(model="tiny", prompt=text, max_tokens=1, extra_body={"return_token_ids": True, **extra})
            return reply.choices[0].model_extra["prompt_token_ids"]

        def chat_ids(**extra):
            reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=1, extra_body={"return_token_ids": True, **extra})
            return reply.model_extra["prompt_token_ids"]

        assert completion_ids() == [0] + plain and completion_ids(add_special_tokens=False) == plain
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert chat_ids() == tokenizer.encode(rendered, add_special_tokens=False) and chat_ids(add_special_tokens=True) == [0] + chat_ids()
        with httpx.Client(timeout=30) as http:
            for extra in ({}, {"add_special_tokens": True}):
                assert http.post(f"{base}/tokenize", json={"messages": messages, **extra}).json()["tokens"] == chat_ids(**extra)
            assert http.post(f"{base}/tokenize", json={"prompt": text}).json()["tokens"] == completion_ids()
        echoed = client.completions.create(model="tiny", prompt="hé " + text, max_tokens=2, echo=True, logprobs=0, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0]
        tokens, offsets = echoed.logprobs.tokens, echoed.logprobs.text_offset
        assert tokens[0] == "<|endoftext|>" and offsets[:2] == [0, 0] and echoed.text.startswith("hé " + text)
        for token, offset in zip(tokens[1:], offsets[1:]):
            head = token.split("\ufffd")[0]
            assert echoed.text[offset: offset + len(head)] == head, (token, offset, echoed.text)
    finally:
        stop_server(proc)
