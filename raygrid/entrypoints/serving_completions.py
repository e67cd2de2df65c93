"""POST /v1/completions: one or several prompts (text or token ids), each with n completions, streamed as
server-sent events or not; echo and OpenAI's legacy logprobs (the prompt's tokens first under echo)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

from fastapi import Request

from raygrid.engine.async_llm import AsyncLLM
from raygrid.engine.detokenizer import TextOffsets
from raygrid.engine.input_processor import truncate_prompt
from raygrid.engine.outputs import CompletionOutput
from raygrid.engine.sampling_params import SamplingParams
from raygrid.entrypoints.openai_protocol import (
    SYSTEM_FINGERPRINT,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from raygrid.entrypoints.serving_base import (APIError, OpenAIServing, collect, error_event, merge, merge_outputs, prompt_logprobs, sse,
                                              sse_json, streaming, token_name, top_items, wire_logprob)


class CompletionServing(OpenAIServing):
    async def create(self, request: CompletionRequest, raw: Request):
        self.check_model(request.model)
        if request.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if request.best_of is not None and request.best_of != request.n:
            raise APIError(400, f"best_of ({request.best_of}) is not supported: raygrid returns every one of the n completions it makes",
                           param="best_of")
        params = self.make_params(request)
        engine = self.engine
        has_text = isinstance(request.prompt, str) or any(isinstance(p, str) for p in request.prompt)
        # Off the event loop when there is text to tokenize; token ids need no thread hop.
        prompts = (await asyncio.to_thread(normalize_prompts, request.prompt, engine, request.add_special_tokens) if has_text
                   else normalize_prompts(request.prompt, engine))
        whole = [len(p) for p in prompts]
        prompts = [truncate_prompt(p, params) for p in prompts]  # before the context check, echo and usage
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": max(self.max_len - max(len(p) for p in prompts), 1)})
        for ids in prompts:
            self.check_context(ids, params, "prompt")
        request_id, engine_id = self.request_ids("cmpl", request, raw)
        streams = [await self.start(ids, params, request, f"{engine_id}-{i}") for i, ids in enumerate(prompts)]
        n = params.n
        if request.stream:
            return streaming(self.stream(request, request_id, prompts, whole, streams, params))
        results = await collect(streams, raw)
        choices, completion_tokens = [], 0
        for i, outputs in enumerate(results):
            merged = merge_outputs(outputs)
            echoed = self.echo_text(request, prompts, i, whole[i])
            for completion in merged.outputs:
                if request.echo_only:
                    completion = echo_only_completion(completion, params.logprobs is not None)
                completion_tokens += len(completion.token_ids)
                logprobs = None
                if params.logprobs is not None:
                    logprobs = self.echo_logprobs(request, prompts[i], merged.prompt_logprobs, echoed)
                    append_legacy_logprobs(logprobs, completion.token_ids, completion.logprobs or [], params.logprobs,
                                           self.text_offsets(len(echoed), params), as_ids=request.return_tokens_as_token_ids)
                choices.append(
                    CompletionChoice(
                        index=i * n + completion.index,
                        text=echoed + completion.text,
                        logprobs=logprobs,
                        finish_reason=completion.finish_reason,
                        stop_reason=completion.stop_reason,
                        prompt_logprobs=prompt_logprobs(merged.prompt_logprobs, prompts[i], request.prompt_logprobs),
                        prompt_token_ids=prompts[i] if request.return_token_ids else None,
                        token_ids=list(completion.token_ids) if request.return_token_ids else None,
                    )
                )
        prompt_tokens = sum(len(p) for p in prompts)
        usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)
        return CompletionResponse(id=request_id, model=request.model, choices=sorted(choices, key=lambda c: c.index), usage=usage)

    def echo_text(self, request: CompletionRequest, prompts, i: int, whole: int) -> str:
        """echo: the prompt comes first, as in OpenAI's legacy API ("" without echo); the part the model read, where
        truncate_prompt_tokens cut it from ``whole`` tokens."""
        if not request.echo:
            return ""
        text = request_prompt_text(request.prompt, i) if len(prompts[i]) == whole else None
        return text or self.engine.processor.tokenizer.decode(prompts[i])

    def echo_logprobs(self, request: CompletionRequest, prompt_ids: list[int], prompt_logprobs, echoed: str) -> CompletionLogprobs:
        """Legacy logprobs that start with the prompt's tokens under echo (the first has no entry: nothing predicts it);
        their offsets are in ``echoed``, the prompt's text as it comes back."""
        logprobs = CompletionLogprobs()
        if request.echo:
            entries = list(prompt_logprobs or [])
            entries += [None] * (len(prompt_ids) - len(entries))
            offsets = TextOffsets(self.token_bytes, text=echoed, specials=self.special_ids)
            append_legacy_logprobs(logprobs, prompt_ids, entries, request.logprobs, offsets, self.decode_one,
                                   as_ids=request.return_tokens_as_token_ids)
        return logprobs

    def text_offsets(self, start: int, params: SamplingParams) -> TextOffsets:
        """Offsets of a completion's tokens in its text, which starts at ``start`` of the choice's (after an echo)."""
        skipped = self.special_ids if params.skip_special_tokens else frozenset()
        return TextOffsets(self.token_bytes, start, skipped)

    def decode_one(self, token_id: int) -> str:
        return self.engine.processor.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    async def stream(self, request: CompletionRequest, request_id: str, prompts, whole: list[int], streams, params: SamplingParams) -> AsyncIterator[str]:
        n = params.n
        created = int(time.time())
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        continuous = include_usage and request.stream_options.continuous_usage_stats
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = 0
        offsets: dict[int, TextOffsets] = {}  # per choice, from its first chunk (which carries the echoed prompt) on
        try:
            async for i, output in merge(streams):
                for completion in output.outputs:
                    index = i * n + completion.index
                    if request.echo_only:
                        completion = echo_only_completion(completion, request.logprobs is not None)
                    completion_tokens += len(completion.token_ids)
                    first = index not in offsets
                    echoed = self.echo_text(request, prompts, i, whole[i]) if first else ""
                    if first:
                        offsets[index] = self.text_offsets(len(echoed), params)
                    logprobs = None
                    if request.logprobs is not None:
                        logprobs = self.echo_logprobs(request, prompts[i], output.prompt_logprobs, echoed) if echoed else CompletionLogprobs()
                        append_legacy_logprobs(logprobs, completion.token_ids, completion.logprobs or [], request.logprobs, offsets[index],
                                               as_ids=request.return_tokens_as_token_ids)
                    completion = dataclasses.replace(completion, text=echoed + completion.text) if echoed else completion
                    # The hot path of streaming: the chunk (CompletionResponse's shape) as a plain dict, no pydantic.
                    choice = {"index": index, "text": completion.text, "logprobs": logprobs.model_dump() if logprobs is not None else None,
                              "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}
                    if request.return_token_ids:
                        choice["token_ids"] = list(completion.token_ids)
                        if first:
                            choice["prompt_token_ids"] = prompts[i]
                    body = {"id": request_id, "object": "text_completion", "created": created, "model": request.model,
                            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [choice]}
                    if include_usage:  # as OpenAI's: null until the last chunk, unless asked for continuously
                        body["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                         "total_tokens": prompt_tokens + completion_tokens} if continuous else None
                    yield sse_json(body)
            if include_usage:
                usage = UsageInfo(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens)
                yield sse(CompletionResponse(id=request_id, created=created, model=request.model, choices=[], usage=usage))
        except Exception as error:  # noqa: BLE001 - the stream ends with an error event, never a cut connection
            yield error_event(error)
        yield sse("[DONE]")


def echo_only_completion(completion: CompletionOutput, with_logprobs: bool) -> CompletionOutput:
    """echo with max_tokens 0: the one token the engine had to sample is dropped."""
    return CompletionOutput(completion.index, "", [], None, [] if with_logprobs else None, finish_reason="length")


def normalize_prompts(prompt, engine: AsyncLLM, add_special_tokens: bool = True) -> list[list[int]]:
    """The four prompt shapes of the completions API, as token id lists (text tokenized with the tokenizer's special
    tokens unless ``add_special_tokens`` is false)."""
    if isinstance(prompt, str):
        prompts = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError(400, "prompt is empty", param="prompt")
    try:
        return [engine.processor.tokenize_prompt(p, add_special_tokens)[1] if isinstance(p, str) else list(p) for p in prompts]
    except (ValueError, TypeError, UnicodeError) as error:  # e.g. a lone UTF-16 surrogate the tokenizer cannot take
        raise APIError(400, f"prompt cannot be tokenized: {error}", param="prompt") from None


def request_prompt_text(prompt, index: int) -> str | None:
    """The text of the index-th prompt of a completions request, when it was given as text."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and index < len(prompt) and isinstance(prompt[index], str):
        return prompt[index]
    return None


def append_legacy_logprobs(out: CompletionLogprobs, token_ids: list[int], entries: list, k: int, offsets: TextOffsets,
                           text_of=lambda _token_id: "", as_ids: bool = False) -> None:
    """Append positions to OpenAI's legacy logprobs shape, their text offsets from ``offsets``. An entry of None (a
    prompt's first token) has no logprob; a token with no decoded text takes ``text_of``'s. Each position's
    top_logprobs hold the k most likely tokens and the chosen one. ``as_ids``: tokens are named 'token_id:N'."""
    for token_id, entry in zip(token_ids, entries):
        chosen = entry[token_id] if entry is not None else None
        if as_ids:
            token = token_name(token_id, chosen, as_ids)
        else:
            token = chosen.decoded_token if chosen is not None and chosen.decoded_token is not None else text_of(token_id)
        out.tokens.append(token)
        out.token_logprobs.append(wire_logprob(chosen.logprob) if chosen is not None else None)
        out.text_offset.append(offsets(token_id))
        if entry is None:
            out.top_logprobs.append(None)
            continue
        # The k most likely, and the chosen token where it is not among them: up to k + 1, as OpenAI's legacy API
        # and vLLM give.
        top = top_items(entry, k)
        if chosen is not None and chosen.rank > k:
            top.append((token_id, chosen))
        out.top_logprobs.append({token_name(top_id, lp, as_ids): wire_logprob(lp.logprob) for top_id, lp in top})
