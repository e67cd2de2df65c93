"""The server's routes besides generation, as vLLM serves them: one model's card, and tokenization both ways
with the engine's own tokenizer and chat template (so a client can count a prompt's tokens exactly)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from pydantic import Field

from raygrid.engine.async_llm import AsyncLLM
from raygrid.entrypoints.openai_protocol import ChatMessage, ModelCard, _Strict


class TokenizeRequest(_Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    chat_template: str | None = None


class TokenizeResponse(_Strict):
    count: int
    max_model_len: int
    tokens: list[int]


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
        if (request.prompt is None) == (request.messages is None):
            raise api_error(400, "give one of prompt and messages", "prompt")
        try:
            if request.messages is not None:
                conversation = [{"role": m.role, "content": m.text()} for m in request.messages]
                tokens = await asyncio.to_thread(engine.processor.apply_chat_template, conversation, request.chat_template,
                                                 request.add_generation_prompt)
            else:
                tokens = await asyncio.to_thread(tokenizer.encode, request.prompt, add_special_tokens=request.add_special_tokens)
        except (ValueError, TypeError, UnicodeError) as error:
            raise api_error(400, f"cannot be tokenized: {error}", "messages" if request.messages is not None else "prompt") from None
        return TokenizeResponse(count=len(tokens), max_model_len=max_len, tokens=tokens)

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
