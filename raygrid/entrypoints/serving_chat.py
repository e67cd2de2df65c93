"""POST /v1/chat/completions: the conversation through the chat template (tools included), n completions streamed
as server-sent events or not, with reasoning split from the answer (``--reasoning-parser``) and tool calls parsed
from the text (``--tool-call-parser``), and OpenAI's chat logprobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from raygrid.engine.async_llm import AsyncLLM
from raygrid.engine.detokenizer import TokenBytes
from raygrid.engine.input_processor import truncate_prompt
from raygrid.engine.outputs import CompletionOutput
from raygrid.engine.sampling_params import SamplingParams
from raygrid.entrypoints.openai_protocol import (
    SYSTEM_FINGERPRINT,
    AssistantMessage,
    ChatChoiceLogprobs,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatMessage,
    ChatTool,
    ChatTokenLogprob,
    TopLogprob,
    UsageInfo,
    tool_dicts,
)
from raygrid.entrypoints.reasoning import REASONING_PARSERS
from raygrid.entrypoints.serving_base import (APIError, OpenAIServing, collect, error_event, merge, merge_outputs, prompt_logprobs, sse,
                                              sse_json, streaming, token_name, top_items, wire_logprob)
from raygrid.entrypoints.tool_calls import ToolStream, reply_tool_calls, tool_finish_reason


def render_messages(processor, messages: list[ChatMessage], chat_template: str | None, add_generation_prompt: bool,
                    continue_final_message: bool, tools: list[ChatTool] | None,
                    chat_template_kwargs: dict[str, Any] | None, add_special_tokens: bool = False) -> tuple[str, list[int]]:
    """A request's conversation through the chat template: its text and token ids. The chat route and /tokenize both
    render with it, so that /tokenize counts what the chat route sends."""
    return processor.render_chat([m.for_template() for m in messages], chat_template, add_generation_prompt,
                                 continue_final_message, add_special_tokens=add_special_tokens, tools=tool_dicts(tools) or None,
                                 **(chat_template_kwargs or {}))


class ChatServing(OpenAIServing):
    def __init__(self, engine: AsyncLLM, served_model_names: list[str], reasoning_parser: str | None = None,
                 tool_call_parser: str | None = None) -> None:
        super().__init__(engine, served_model_names)
        self.reasoning = REASONING_PARSERS[reasoning_parser]() if reasoning_parser else None
        self.tool_call_parser = tool_call_parser

    async def create(self, request: ChatCompletionRequest, raw: Request):
        self.check_model(request.model)
        if request.tools and request.effective_tool_choice == "auto" and self.tool_call_parser is None:
            raise APIError(400, "tool_choice 'auto' (the default with tools) needs the server started with --tool-call-parser",
                           param="tool_choice")
        params = self.make_params(request)
        try:
            # Off the event loop: a large conversation must not stall /health and the streams in flight.
            _, prompt_ids = await asyncio.to_thread(
                render_messages, self.engine.processor, request.messages, request.chat_template, request.add_generation_prompt,
                request.continue_final_message, request.tools, request.chat_template_kwargs, request.add_special_tokens)
        except ValueError as error:
            raise APIError(400, str(error), param="messages") from None
        except Exception as error:  # a template that fails to render on this conversation
            raise APIError(400, f"messages: the chat template failed: {error}", param="messages") from None
        prompt_ids = truncate_prompt(prompt_ids, params)  # before the context check: long prompts are what it is for
        if params.max_tokens is None:
            params = params.model_copy(update={"max_tokens": max(self.max_len - len(prompt_ids), 1)})
        self.check_context(prompt_ids, params, "messages")
        request_id, engine_id = self.request_ids("chatcmpl", request, raw)
        stream = await self.start(prompt_ids, params, request, engine_id)
        if request.stream:
            return streaming(self.stream(request, request_id, prompt_ids, stream, params))
        opened = self.prompt_opens_thinking(prompt_ids)
        (outputs,) = await collect([stream], raw)
        choices, completion_tokens, merged, echoed = [], 0, merge_outputs(outputs), request.echoed
        for completion in merged.outputs:
            completion_tokens += len(completion.token_ids)
            message = self.assistant_message(completion.text, opened)
            message.content, message.tool_calls = reply_tool_calls(message.content or "", request.effective_tool_choice,
                                                                    self.tool_call_parser is not None, request.parallel_tool_calls)
            if echoed:
                message.content = echoed + (message.content or "")
            choices.append(
                ChatCompletionChoice(
                    index=completion.index,
                    message=message,
                    logprobs=(chat_logprobs(completion, params.logprobs, self.token_bytes, request.return_tokens_as_token_ids)
                              if params.logprobs is not None else None),
                    finish_reason=tool_finish_reason(completion.finish_reason, bool(message.tool_calls), request.effective_tool_choice),
                    stop_reason=completion.stop_reason,
                    token_ids=list(completion.token_ids) if request.return_token_ids else None,
                )
            )
        usage = UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=completion_tokens, total_tokens=len(prompt_ids) + completion_tokens)
        return ChatCompletionResponse(id=request_id, model=request.model, choices=choices, usage=usage,
                                      prompt_logprobs=prompt_logprobs(merged.prompt_logprobs, prompt_ids, request.prompt_logprobs),
                                      prompt_token_ids=prompt_ids if request.return_token_ids else None)

    def prompt_opens_thinking(self, prompt_ids: list[int]) -> bool:
        return self.reasoning is not None and self.reasoning.opens_thinking(self.engine.processor.tokenizer.decode(prompt_ids[-8:]))

    def assistant_message(self, text: str, opened: bool) -> AssistantMessage:
        if self.reasoning is None:
            return AssistantMessage(content=text)
        thought, answer = self.reasoning.split(text, opened)
        return AssistantMessage(content=answer, reasoning_content=thought)

    async def stream(self, request: ChatCompletionRequest, request_id: str, prompt_ids, stream, params: SamplingParams) -> AsyncIterator[bytes | str]:
        created = int(time.time())
        include_usage = request.stream_options is not None and request.stream_options.include_usage
        continuous = include_usage and request.stream_options.continuous_usage_stats
        prompt_tokens, completion_tokens = len(prompt_ids), 0

        # The hot path of streaming: chunks (ChatCompletionChunk's shape) as plain dicts, no pydantic. As
        # OpenAI's, "usage" is there (null until the last chunk) only when asked for.
        def chunk(choices, usage=None, prompt_token_ids=None):
            body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": request.model,
                    "system_fingerprint": SYSTEM_FINGERPRINT, "choices": choices}
            if include_usage:
                body["usage"] = usage
            if prompt_token_ids is not None:
                body["prompt_token_ids"] = prompt_token_ids
            return sse_json(body)

        def usage_now():
            return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens}

        # With a reasoning parser, each choice's text goes through its own splitter into reasoning and answer.
        opened = self.prompt_opens_thinking(prompt_ids)
        splitters = [self.reasoning.stream(opened) for _ in range(params.n)] if self.reasoning is not None else None
        tools = [ToolStream(request.effective_tool_choice, self.tool_call_parser is not None, request.parallel_tool_calls)
                 for _ in range(params.n)]
        def opening(delta: dict) -> list[dict]:
            """Every choice's delta before its first token (with return_token_ids, of no tokens)."""
            extra = {"token_ids": []} if request.return_token_ids else {}
            return [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None, **extra} for i in range(params.n)]

        # The first chunk of each choice carries the role, as OpenAI's does (and the prompt's ids where asked, as
        # vLLM's); with echo, the last (assistant) message's text follows; later deltas carry content only.
        yield chunk(opening({"role": "assistant", "content": ""}), prompt_token_ids=prompt_ids if request.return_token_ids else None)
        if echoed := request.echoed:
            yield chunk(opening({"content": echoed}))
        try:
            async for _, output in merge([stream]):
                for completion in output.outputs:
                    completion_tokens += len(completion.token_ids)
                    logprobs = (chat_logprobs(completion, params.logprobs, self.token_bytes, request.return_tokens_as_token_ids).model_dump()
                                if params.logprobs is not None else None)
                    delta = {"content": completion.text}
                    if splitters is not None:
                        thought, answer = splitters[completion.index].feed(completion.text)
                        if completion.finish_reason is not None:
                            more_thought, more_answer = splitters[completion.index].finish()
                            thought, answer = thought + more_thought, answer + more_answer
                        delta = {"reasoning_content": thought, "content": answer} if thought else {"content": answer}
                    finish_reason = completion.finish_reason
                    if tools[completion.index].active:
                        delta = tool_delta(tools[completion.index], delta, finish_reason is not None)
                        finish_reason = tools[completion.index].finish_reason(finish_reason)
                    choice = {"index": completion.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
                    if request.return_token_ids:
                        choice["token_ids"] = list(completion.token_ids)
                    yield chunk([choice], usage_now() if continuous else None)
            if include_usage:
                yield chunk([], usage_now())
        except Exception as error:  # noqa: BLE001 - the stream ends with an error event, never a cut connection
            yield error_event(error)
        yield sse("[DONE]")


def tool_delta(tools: ToolStream, delta: dict, last: bool) -> dict:
    """A chat delta with its content passed through the choice's tool-call parsing."""
    content, calls = tools.feed(delta.get("content") or "")
    if last:
        more_content, more_calls = tools.finish()
        content, calls = content + more_content, calls + more_calls
    delta = dict(delta, content=content)
    if calls:
        delta["tool_calls"] = calls
    return delta


def chat_logprobs(completion: CompletionOutput, k: int, token_bytes: TokenBytes, as_ids: bool = False) -> ChatChoiceLogprobs:
    """OpenAI's chat logprobs; ``bytes`` are each token's own (a token holding part of a character decodes to U+FFFD).
    ``as_ids``: tokens are named 'token_id:N' (their bytes are still their own)."""
    content = []
    for token_id, entry in zip(completion.token_ids, completion.logprobs or []):
        sampled = entry[token_id]
        content.append(
            ChatTokenLogprob(
                token=token_name(token_id, sampled, as_ids),
                logprob=wire_logprob(sampled.logprob),
                bytes=token_bytes(token_id),
                top_logprobs=[TopLogprob(token=token_name(top_id, lp, as_ids), logprob=wire_logprob(lp.logprob), bytes=token_bytes(top_id))
                              for top_id, lp in top_items(entry, k)],
            )
        )
    return ChatChoiceLogprobs(content=content)
