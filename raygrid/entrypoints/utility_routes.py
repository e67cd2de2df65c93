"""The server's routes besides generation, as vLLM serves them: one model's card, and tokenization both ways
with the engine's own tokenizer and chat template (so a client can count a prompt's tokens exactly)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import Field, model_validator

from raygrid.engine.async_llm import AsyncLLM
from raygrid.engine.input_processor import InvalidRequest, check_chat_prompt_flags
from raygrid.entrypoints.openai_protocol import ChatMessage, ChatTool, ModelCard, _Strict
from raygrid.entrypoints.serving_chat import render_messages


class TokenizeRequest(_Strict):
    """vLLM's /tokenize: a ``prompt``, or ``messages`` rendered as /v1/chat/completions renders them (the same
    template, tools and template kwargs), so that the count is the chat route's."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = Field(default=None, description="default: true for a prompt, false for messages "
                                                                       "(their template writes the special tokens)")
    add_generation_prompt: bool | None = None  # messages only, as the rest below; default true
    continue_final_message: bool | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise InvalidRequest("give one of prompt and messages", "prompt")
        if self.prompt is not None:
            for name in ("add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs", "tools"):
                if getattr(self, name) is not None:
                    raise InvalidRequest(f"{name} applies to messages, not to a prompt", name)
        else:
            check_chat_prompt_flags(self.add_generation_prompt is not False, bool(self.continue_final_message))
        return self


class TokenizeResponse(_Strict):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int] = Field(min_length=0)


class DetokenizeResponse(_Strict):
    prompt: str


def utility_router(engine: AsyncLLM, names: list[str], check_model, api_error) -> APIRouter:
    """``check_model(name)`` raises the server's 404 for a model it does not serve; ``api_error(status,
    message, param)`` makes the server's error."""
    router = APIRouter()
    max_len = engine.config.model.max_model_len
    tokenizer = engine.processor.tokenizer

    @router.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str):
        check_model(model_id)
        return ModelCard(id=model_id, root=engine.config.model.model, max_model_len=max_len)

    @router.post("/tokenize")
    async def tokenize(request: TokenizeRequest):
        if request.model is not None:
            check_model(request.model)
        try:
            if request.messages is not None:
                _, tokens = await asyncio.to_thread(
                    render_messages, engine.processor, request.messages, request.chat_template,
                    request.add_generation_prompt is not False, bool(request.continue_final_message), request.tools,
                    request.chat_template_kwargs, bool(request.add_special_tokens))
            else:
                tokens = await asyncio.to_thread(tokenizer.encode, request.prompt, add_special_tokens=request.add_special_tokens is not False)
        except Exception as error:  # a template that fails on this conversation, text that cannot be tokenized
            raise api_error(400, f"cannot be tokenized: {error}", "messages" if request.messages is not None else "prompt") from None
        strs = tokenizer.convert_ids_to_tokens(tokens) if request.return_token_strs else None
        return TokenizeResponse(count=len(tokens), max_model_len=max_len, tokens=tokens, token_strs=strs)

    @router.post("/detokenize")
    async def detokenize(request: DetokenizeRequest):
        if request.model is not None:
            check_model(request.model)
        vocab = engine.processor.vocab_size
        bad = [t for t in request.tokens if not 0 <= t < vocab]
        if bad:
            raise api_error(400, f"tokens has ids outside [0, {vocab}): {bad[:5]}", "tokens")
        return DetokenizeResponse(prompt=tokenizer.decode(request.tokens))

    return router
