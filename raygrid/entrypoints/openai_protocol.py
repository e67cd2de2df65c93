"""Request and response bodies of the OpenAI API (completions, chat completions, models, errors),
with vLLM's extra sampling fields. A request field raygrid does not implement is refused with a 400 that
names it, never dropped in silence; the fields that only describe the caller (``user``, ``metadata``,
``store``, ``service_tier``) are accepted and logged, as vLLM does."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from raygrid.engine.input_processor import InvalidRequest, check_chat_prompt_flags
from raygrid.engine.sampling_params import SamplingParams, StructuredOutputsParams
from raygrid.entrypoints.tool_calls import forced_schema
from raygrid.validation import InvalidArgument


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def system_fingerprint() -> str:
    """What OpenAI's ``system_fingerprint`` stands for: the backend's configuration, here raygrid's version."""
    from raygrid import __version__

    return f"raygrid-{__version__}"


SYSTEM_FINGERPRINT = system_fingerprint()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Strict):
    name: str = Field(default="response", max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structured_outputs(self) -> StructuredOutputsParams | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.json_schema is None:
            raise InvalidRequest("response_format: type 'json_schema' needs a json_schema", "response_format")
        return StructuredOutputsParams(json=self.json_schema.schema_ if self.json_schema.schema_ is not None else {})


class _SamplingFields(_Strict):
    """Fields shared by both endpoints; range checks are SamplingParams' own."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    # Fields that describe the caller: accepted and logged, nothing else.
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # vLLM extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = Field(default=None, ge=0, description="the top logprobs of each prompt token, returned "
                                        "as prompt_logprobs (not with stream)")
    cache_salt: str | None = Field(default=None, min_length=1, description="requests with different salts share no prefix-cache blocks")
    request_id: str | None = Field(default=None, min_length=1, max_length=256, description="the response's id after its "
                                   "cmpl- or chatcmpl- (an X-Request-Id header takes precedence, as in vLLM)")
    return_token_ids: bool = Field(default=False, description="each choice's token_ids and the prompt's prompt_token_ids "
                                   "(streamed: each chunk's new tokens, and the prompt's in a choice's first chunk)")
    return_tokens_as_token_ids: bool = Field(default=False, description="logprobs name each token 'token_id:N', which "
                                             "tells apart tokens whose texts are not whole or are alike")
    # Structured outputs: OpenAI's response_format, vLLM's structured_outputs, and vLLM's older guided_* fields.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def _structured_outputs(self) -> StructuredOutputsParams | None:
        """The one grammar the request asks for, from whichever field it used."""
        given = {}
        if self.response_format is not None and self.response_format.type != "text":
            given["response_format"] = self.response_format.structured_outputs()
        if self.structured_outputs is not None:
            given["structured_outputs"] = self.structured_outputs
        for name, key in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"), ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                try:
                    given[name] = StructuredOutputsParams(**{key: getattr(self, name)})
                except InvalidArgument as error:  # named as the client sent it, not as the field it becomes
                    problems = "; ".join(message.removeprefix(f"structured_outputs.{key} ") for _, message in error.problems)
                    raise InvalidRequest(f"{name}: {problems}", name) from None
        if len(given) > 1:
            raise InvalidRequest(f"give one of response_format, structured_outputs and guided_*; got {sorted(given)}", sorted(given)[0])
        return next(iter(given.values()), None)

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None, defaults: SamplingParams | None,
                         prompt_logprobs: int | None = None) -> SamplingParams:
        """``defaults``: what the server uses for the fields the request leaves out (the checkpoint's
        generation_config.json sampling fields, as vLLM applies them)."""
        fields: dict[str, Any] = dict(
            n=self.n,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids or [],
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            logit_bias=self._logit_bias(),
            allowed_token_ids=self.allowed_token_ids,
            bad_words=self.bad_words,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            structured_outputs=self._structured_outputs(),
        )
        for name in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty"):
            value = getattr(self, name)
            if value is None and defaults is not None:
                value = getattr(defaults, name)
            if value is not None:
                fields[name] = value
        return SamplingParams(**fields)

    def _logit_bias(self) -> dict[int, float] | None:
        """OpenAI's logit_bias keys are token ids written as strings."""
        if self.logit_bias is None:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise InvalidRequest(f"logit_bias keys must be token ids, got {sorted(self.logit_bias)[:3]}", "logit_bias") from None

    def caller_fields(self) -> dict[str, Any]:
        """What the request says about its caller, for the log."""
        return {k: v for k in ("user", "metadata", "store", "service_tier")
                if (v := getattr(self, k, None)) is not None}


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0)  # up to the server's --max-logprobs (the engine checks)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = Field(default=True, description="a text prompt is tokenized with the tokenizer's special "
                                     "tokens (a BOS, say)")

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        """One line for a prompt of none of the four shapes (not one per shape it failed)."""
        if isinstance(value, str) or _token_ids(value) or (isinstance(value, list) and (
                all(isinstance(p, str) for p in value) or all(_token_ids(p) for p in value))):
            return value
        raise ValueError("must be a string, a list of strings, a list of token ids or a list of token-id lists")

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) back, nothing generated."""
        return self.echo and self.max_tokens == 0

    def sampling_params(self, defaults: SamplingParams | None = None) -> SamplingParams:
        # echo_only still runs one step (a request samples once its prompt is computed); the token is dropped.
        max_tokens = 1 if self.echo_only else self.max_tokens
        # echo with logprobs shows the prompt's logprobs too: the engine computes the wider of the two asks, and
        # each view keeps its own top entries.
        asked = [k for k in (self.prompt_logprobs, self.logprobs if self.echo else None) if k is not None]
        return self._sampling_params(max_tokens, self.logprobs, defaults, max(asked, default=None))


class ChatContentPart(_Strict):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("type") != "text":
            raise ValueError(f"content parts of type {data.get('type')!r} are not supported (only 'text')")
        return data


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":  # only an assistant's (calling tools) may leave it out
            raise ValueError(f"a {self.role} message needs content")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (an assistant's calls and a tool's call id kept)."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


def tool_dicts(tools: list[ChatTool] | None) -> list[dict[str, Any]]:
    """Tools as chat templates read them."""
    return [tool.model_dump(exclude_none=True) for tool in tools or []]


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)  # up to the server's --max-logprobs (the engine checks)
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the last message left open for the model to continue (vLLM's)
    add_special_tokens: bool = Field(default=False, description="the tokenizer's special tokens (a BOS, say) on top of "
                                     "what the chat template writes")
    echo: bool = Field(default=False, description="the reply's content starts with the last message's when that is the "
                       "assistant's (vLLM's; with continue_final_message, the whole message comes back)")
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True  # false: at most one tool call in a reply

    @model_validator(mode="after")
    def _prompt_flags(self) -> "ChatCompletionRequest":
        check_chat_prompt_flags(self.add_generation_prompt, self.continue_final_message)
        return self

    @property
    def effective_tool_choice(self) -> str | dict:
        """"none", "auto", "required" or the named choice as a dict; "auto" by default when tools are given."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice.model_dump() if isinstance(self.tool_choice, NamedToolChoice) else self.tool_choice

    def tool_dicts(self) -> list[dict[str, Any]]:
        return tool_dicts(self.tools)

    @property
    def echoed(self) -> str:
        """With echo: the text the reply's content starts with, the last message's if the assistant wrote it ("" else)."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == "assistant" else ""

    def sampling_params(self, defaults: SamplingParams | None = None) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true", "top_logprobs")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        params = self._sampling_params(max_tokens, logprobs, defaults, self.prompt_logprobs)
        choice = self.effective_tool_choice
        if choice != "none" and not self.tools:
            raise InvalidRequest(f"tool_choice {choice!r} needs tools", "tool_choice")
        try:
            forced = forced_schema(self.tool_dicts(), choice, self.parallel_tool_calls)
        except ValueError as error:  # a named function that is not among the tools
            raise InvalidRequest(str(error), "tool_choice") from None
        if forced is not None:
            if params.structured_outputs is not None:
                raise InvalidRequest("tool_choice 'required' or a named function cannot be combined with response_format, "
                                 "structured_outputs or guided_*", "tool_choice")
            params = params.model_copy(update={"structured_outputs": forced})
        return params


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's shape for one token of a prompt position: its logprob, its rank there, its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's prompt_logprobs: one entry per prompt token, None for the first (nothing predicts it), each the prompt's
# token and the top ``prompt_logprobs`` tokens by id.
PromptLogprobs = list[dict[int, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids (vLLM's)
    token_ids: list[int] | None = None  # with return_token_ids


class CompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("cmpl"))
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # with --reasoning-parser: the reply's thinking
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # with return_token_ids (vLLM's)


class ChatCompletionResponse(BaseModel):
    id: str = Field(default_factory=lambda: random_id("chatcmpl"))
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids


# The streamed chat chunk's shape. The server writes these chunks as plain dicts (no pydantic per token);
# the tests check the wire against these models.
class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # with return_token_ids: the chunk's new tokens


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = SYSTEM_FINGERPRINT
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # with return_token_ids: in the first chunk


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "raygrid"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
