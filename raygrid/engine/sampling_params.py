"""SamplingParams: how one request turns logits into tokens and when it stops (vLLM's field names)."""

from __future__ import annotations

import json

from pydantic import ConfigDict, Field, field_validator, model_validator

from raygrid.validation import OneLineErrors

# Below this temperature a request is sampled greedily (argmax), as in vLLM.
GREEDY_TEMPERATURE = 1e-5


class StructuredOutputsParams(OneLineErrors):
    """What the output must match (vLLM's fields): exactly one of a JSON schema, any JSON object, a regex,
    a choice of strings, or a Lark / GBNF grammar. Compiled by llguidance (engine/structured_output.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    json_schema: dict | str | None = Field(default=None, alias="json", description="a JSON schema (dict or its text)")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = Field(default=None, description="a Lark grammar, or GBNF (llama.cpp's)")
    json_object: bool | None = Field(default=None, description="True: any JSON object")

    @model_validator(mode="after")
    def _exactly_one(self) -> "StructuredOutputsParams":
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, "json_schema" if name == "json" else name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs takes exactly one of json, regex, choice, grammar, json_object; got {given or 'none'}")
        if isinstance(self.json_schema, str):
            try:
                json.loads(self.json_schema)
            except ValueError as error:
                raise ValueError(f"structured_outputs.json is not valid JSON: {error}") from None
        return self

    def kind_and_spec(self) -> tuple[str, str]:
        """("json" | "json_object" | "regex" | "choice" | "grammar", the spec as text): the grammar cache's key."""
        if self.json_schema is not None:
            spec = self.json_schema if isinstance(self.json_schema, str) else json.dumps(self.json_schema, sort_keys=True)
            return "json", spec
        if self.json_object:
            return "json_object", '{"type": "object"}'
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(self.choice)
        return "grammar", self.grammar


class SamplingParams(OneLineErrors):
    """Validated on construction: bad values raise an ``InvalidArgument`` (a ValueError) of one line naming each
    field and its limit: ``temperature: must be >= 0.0 (got -1)``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n: int = Field(default=1, ge=1, le=128, description="completions per prompt")
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, description="0 or -1 disables top-k")
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63, description="any int64, as in vLLM")
    max_tokens: int | None = Field(default=16, ge=1, description="None: up to the context length")
    min_tokens: int = Field(default=0, ge=0)
    stop: list[str] = Field(default_factory=list)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = Field(default=None, ge=0, description="top logprobs returned per output token")
    prompt_logprobs: int | None = Field(default=None, ge=0, description="top logprobs returned per prompt token (the first "
                                                                       "has none); such a request takes no prefix-cache hits")
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = Field(default=True, description="False: return token ids only, no text")
    logit_bias: dict[int, float] | None = Field(default=None, description="token id -> bias added to its logit, clamped to [-100, 100]")
    allowed_token_ids: list[int] | None = Field(default=None, min_length=1, description="sample only among these tokens")
    bad_words: list[str] | None = Field(default=None, description="words never to complete: the last token of each is banned "
                                                                  "where the outputs so far end with the rest of it")
    truncate_prompt_tokens: int | None = Field(default=None, ge=1, description="keep only the last k prompt tokens")
    structured_outputs: StructuredOutputsParams | None = Field(default=None, description="a grammar the output must match")
    # Filled by the engine from bad_words (the token sequences each word can take); not for callers.
    bad_words_token_ids: list[list[int]] = Field(default_factory=list)

    @field_validator("logit_bias")
    @classmethod
    def _clamp_bias(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is None:
            return None
        if any(t < 0 for t in value):
            raise ValueError("logit_bias token ids must be >= 0")
        return {t: min(max(b, -100.0), 100.0) for t, b in value.items()}

    @field_validator("allowed_token_ids")
    @classmethod
    def _allowed_non_negative(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(t < 0 for t in value):
            raise ValueError("allowed_token_ids must be >= 0")
        return value

    @field_validator("bad_words")
    @classmethod
    def _bad_words_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(not w.strip() for w in value):
            raise ValueError("bad_words must not hold empty words")
        return value

    @field_validator("bad_words_token_ids")
    @classmethod
    def _bad_sequences_not_empty(cls, value: list[list[int]]) -> list[list[int]]:
        if any(not seq for seq in value):
            raise ValueError("bad_words_token_ids must not hold empty sequences")
        if any(t < 0 for seq in value for t in seq):
            raise ValueError("bad_words_token_ids must be >= 0")
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value):
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _stop_needs_text(self) -> "SamplingParams":
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        return self

    @field_validator("stop_token_ids")
    @classmethod
    def _token_ids_non_negative(cls, value: list[int]) -> list[int]:
        if any(t < 0 for t in value):
            raise ValueError("stop_token_ids must be >= 0")
        return value

    @model_validator(mode="after")
    def _check_min_tokens(self) -> "SamplingParams":
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        return self

    def token_ids_to_check(self) -> dict[str, list[int]]:
        """The token ids of each field that names tokens, for the engine to check against its vocabulary."""
        return {"stop_token_ids": self.stop_token_ids, "logit_bias": list(self.logit_bias or {}),
                "allowed_token_ids": self.allowed_token_ids or [],
                "bad_words_token_ids": [t for seq in self.bad_words_token_ids for t in seq]}

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def max_stop_len(self) -> int:
        return max((len(s) for s in self.stop), default=0)
