"""What every front end does before a request reaches the engine core: build the engine from its
arguments, tokenize (chat templates included), check the request against the engine's limits, and
split ``n > 1`` into child requests."""

from __future__ import annotations

import array
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoTokenizer, GenerationConfig

from raygrid.config import EngineConfig
from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.request import Request
from raygrid.engine.sampling_params import SamplingParams
from raygrid.engine.structured_output import GrammarCompiler, GrammarError
from raygrid.models.loader import load_hf_config

PromptType = str | dict[str, Any]
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids", "cache_salt"})  # what a dict prompt may hold


def build_engine_config(model: str, **engine_kwargs) -> EngineConfig:
    """The engine's configuration from vLLM-style keyword arguments (the fields of ``EngineArgs``),
    resolved against the checkpoint."""
    return EngineArgs(model=model, **engine_kwargs).create_engine_config()


class InvalidRequest(ValueError):
    """A request outside the engine's limits; ``param`` names the request field at fault."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_chat_prompt_flags(add_generation_prompt: bool, continue_final_message: bool) -> None:
    if add_generation_prompt and continue_final_message:
        raise InvalidRequest("continue_final_message and add_generation_prompt cannot both be true: a conversation either "
                             "opens a new reply or continues its last message", "continue_final_message")


@dataclass
class ProcessedRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    children: list[Request]


def ids_outside(ids, vocab_size: int) -> list:
    """Up to five of ``ids`` that are not integers in [0, vocab_size). Checked by NumPy first: a 32k-token prompt's
    ids take about half the time of a Python loop over them, which runs only to name the bad ones."""
    try:
        values = np.frombuffer(array.array("q", ids), dtype=np.int64)  # refuses what is not an integer
        if not len(values) or (values.min() >= 0 and values.max() < vocab_size):
            return []
    except (TypeError, OverflowError):
        pass
    bad = [t for t in ids if not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size][:5]
    return [int(t) if isinstance(t, np.integer) else t for t in bad]  # named as numbers, not as np.int64(...)


def truncate_prompt(token_ids: list[int], params: SamplingParams) -> list[int]:
    """The prompt as the model reads it: its last ``truncate_prompt_tokens`` tokens, when asked (the prompt's end is
    what the model continues). The OpenAI server takes it before its context check, echo and usage too."""
    keep = params.truncate_prompt_tokens
    return token_ids[-keep:] if keep is not None and len(token_ids) > keep else token_ids


class InputProcessor:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_path = config.model.model
        self.hf_config = load_hf_config(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(config.model.tokenizer or model_path)
        self.vocab_size = self.hf_config.vocab_size
        self.max_model_len = config.model.max_model_len
        self.eos_token_ids = self._eos_token_ids(model_path)

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Structured outputs' compiler, made on first use (its tokenizer takes a moment to build)."""
        return GrammarCompiler(self.config.model.tokenizer or self.config.model.model, self.vocab_size, self.eos_token_ids,
                               hf_tokenizer=self.tokenizer)

    def _eos_token_ids(self, model_path: str) -> frozenset[int]:
        """The tokenizer's EOS plus generation_config.json's (Llama 3 lists several)."""
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        if (Path(model_path) / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(model_path).eos_token_id
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return frozenset(ids)

    @staticmethod
    def cache_salt(prompt: PromptType) -> str | None:
        """A dict prompt's ``cache_salt``: requests with different salts never share prefix-cache blocks."""
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise InvalidRequest("cache_salt must be a non-empty string", "cache_salt")
        return salt

    def tokenize_prompt(self, prompt: PromptType, add_special_tokens: bool = True) -> tuple[str | None, list[int]]:
        """A prompt's text (None for ids alone) and ids; text is tokenized with the tokenizer's special tokens (a BOS,
        say) unless ``add_special_tokens`` is false."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, dict) and (unknown := sorted(set(prompt) - PROMPT_KEYS)):
            raise InvalidRequest(f"a prompt dict takes {', '.join(sorted(PROMPT_KEYS))}; it has {unknown}", "prompt")
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            return prompt.get("prompt"), ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], self.tokenizer.encode(prompt["prompt"], add_special_tokens=add_special_tokens)
        raise ValueError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}")

    def render_chat(self, conversation: list[dict], chat_template: str | None = None, add_generation_prompt: bool = True,
                    continue_final_message: bool = False, *, add_special_tokens: bool = False,
                    **template_kwargs) -> tuple[str, list[int]]:
        """The conversation through the chat template: its text and token ids. ``continue_final_message``: the last
        message is left open (no end-of-turn after it), so that the model continues it, as vLLM's ("prefilling" a
        reply). ``add_special_tokens``: the tokenizer's (a BOS, say) on top of what the template writes (vLLM's
        default is without). ``template_kwargs`` reach the template (Qwen3's ``enable_thinking``, say)."""
        check_chat_prompt_flags(add_generation_prompt, continue_final_message)
        if chat_template is None and not self.tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat_template; pass chat_template=...")
        text = self.tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tokenize=False, **template_kwargs
        )
        return text, self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def default_sampling_params(self) -> SamplingParams:
        """The checkpoint's generation_config.json sampling defaults (temperature, top_p, top_k, min_p,
        repetition_penalty), as vLLM applies them; SamplingParams() where it has none."""
        path = Path(self.config.model.model) / "generation_config.json"
        if not path.is_file():
            return SamplingParams()
        written = json.loads(path.read_text())  # only what the file sets: transformers' defaults (top_k 50) are not the model's
        return SamplingParams(**{k: written[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
                                 if written.get(k) is not None})

    def bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word as the token sequences it can take in a text: alone and after a space, as vLLM
        tokenizes them (a word inside a sentence usually carries its leading space in its first token)."""
        sequences = []
        for word in words:
            for text in dict.fromkeys([word, word if word.startswith(" ") else " " + word]):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in sequences:
                    sequences.append(ids)
        return sequences

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request against this engine's limits; returns its max_tokens."""
        max_len = self.max_model_len
        if not prompt_token_ids:
            raise InvalidRequest("prompt is empty: at least one token is needed", "prompt")
        if len(prompt_token_ids) >= max_len:
            raise InvalidRequest(
                f"prompt has {len(prompt_token_ids)} tokens; it must be shorter than max_model_len ({max_len}) "
                "to leave room for an output token", "prompt"
            )
        bad = ids_outside(prompt_token_ids, self.vocab_size)
        if bad:
            raise InvalidRequest(f"prompt_token_ids has ids outside [0, {self.vocab_size}): {bad}", "prompt")
        for field, ids in params.token_ids_to_check().items():
            bad = ids_outside(ids, self.vocab_size)
            if bad:
                raise InvalidRequest(f"{field} has ids outside [0, {self.vocab_size}): {bad}", field)
        max_logprobs = self.config.model.max_logprobs
        for field in ("logprobs", "prompt_logprobs"):
            value = getattr(params, field)
            if value is not None and value > max_logprobs:
                raise InvalidRequest(f"{field} ({value}) must be <= max_logprobs ({max_logprobs})", field)
        self._check_a_token_is_left(params)
        room = max_len - len(prompt_token_ids)
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def _check_a_token_is_left(self, params: SamplingParams) -> None:
        """allowed_token_ids that the request's other bans cover whole from its first token on: single-token
        bad_words, and EOS and stop tokens while min_tokens holds. (Bans that come later, a bad word of several
        tokens or a grammar, fail the request when the sampler finds nothing left: token_bans.)"""
        if params.allowed_token_ids is None:
            return
        words = params.bad_words_token_ids or (self.bad_words_token_ids(params.bad_words) if params.bad_words else [])
        left = set(params.allowed_token_ids) - {seq[0] for seq in words if len(seq) == 1}
        if not left:
            raise InvalidRequest("allowed_token_ids: bad_words ban every one of them, so no token is left to sample",
                                 "allowed_token_ids")
        stops = set(params.stop_token_ids) | (set() if params.ignore_eos else self.eos_token_ids)
        if params.min_tokens and left <= stops:
            which = "those that bad_words leave are" if words else "they are all"
            raise InvalidRequest(f"allowed_token_ids: {which} EOS or stop tokens, which min_tokens ({params.min_tokens}) "
                                 "bans for the first tokens, so no token is left to sample", "allowed_token_ids")

    def process(self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0, arrival_time: float | None = None) -> ProcessedRequest:
        """Tokenize and validate; a request with ``n > 1`` becomes n child requests (seeds seed, seed+1, ...,
        wrapping around within int64)."""
        if priority != 0 and self.config.scheduler.policy != "priority":  # as vLLM: not ignored
            raise InvalidRequest(f"priority ({priority}) needs the priority scheduling policy (--scheduling-policy priority); "
                                 "this engine schedules fcfs", "priority")
        text, token_ids = self.tokenize_prompt(prompt)
        token_ids = truncate_prompt(token_ids, params)
        cache_salt = self.cache_salt(prompt)
        if params.bad_words:
            params = params.model_copy(update={"bad_words_token_ids": self.bad_words_token_ids(params.bad_words)})
        max_tokens = self.validate(token_ids, params)
        if params.structured_outputs is not None:
            try:  # compiled here too, so that a bad grammar is the caller's error (a 400), not a failed request
                self.grammars.check(params.structured_outputs)
            except GrammarError as error:
                raise InvalidRequest(str(error), "structured_outputs") from None
        children = []
        for k in range(params.n):
            child_params = params.model_copy(update={"n": 1})
            if params.seed is not None and params.n > 1:
                child_params = child_params.model_copy(update={"seed": (params.seed + k + 2**63) % 2**64 - 2**63})
            child_id = request_id if params.n == 1 else f"{request_id}-{k}"
            children.append(
                Request(child_id, token_ids, child_params, max_tokens, self.eos_token_ids, arrival_time=arrival_time,
                        priority=priority, cache_salt=cache_salt)
            )
        return ProcessedRequest(request_id, text, token_ids, children)
