"""LLM: the offline front end (vLLM's interface). Tokenize, run the engine to completion, detokenize."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import AutoTokenizer, GenerationConfig

from raygrid.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from raygrid.engine.core import EngineCore
from raygrid.engine.output_processor import OutputProcessor
from raygrid.engine.outputs import RequestOutput
from raygrid.engine.request import Request
from raygrid.engine.sampling_params import SamplingParams
from raygrid.engine.scheduler import SchedulerStats
from raygrid.models.default_model import resolve_model_path
from raygrid.models.loader import load_hf_config

logger = logging.getLogger(__name__)

PromptType = str | dict[str, Any]


class LLM:
    """Generate text from prompts with one engine replica.

    >>> llm = LLM(model="tiny-random-qwen3")
    >>> outputs = llm.generate(["Hello"], SamplingParams(max_tokens=8))
    """

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        block_size: int = 16,
        num_kv_blocks: int | None = None,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        long_prefill_token_threshold: int = 0,
        scheduling_policy: str = "fcfs",
        gpu_memory_utilization: float = 0.9,
        max_logprobs: int = 20,
        seed: int = 0,
        device: str = "auto",
    ) -> None:
        model_path = resolve_model_path(model)
        config = EngineConfig(
            model=ModelConfig(model=model_path, tokenizer=tokenizer, dtype=dtype, max_model_len=max_model_len, max_logprobs=max_logprobs, seed=seed),
            cache=CacheConfig(
                block_size=block_size,
                num_kv_blocks=num_kv_blocks,
                enable_prefix_caching=enable_prefix_caching,
                gpu_memory_utilization=gpu_memory_utilization,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                enable_chunked_prefill=enable_chunked_prefill,
                long_prefill_token_threshold=long_prefill_token_threshold,
                policy=scheduling_policy,
            ),
            device=device,
        )
        self.hf_config = load_hf_config(model_path)
        self.config = config.resolve(self.hf_config.max_position_embeddings)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or model_path)
        self.vocab_size = self.hf_config.vocab_size
        self.eos_token_ids = self._eos_token_ids(model_path)
        self.engine = EngineCore(self.config, self.eos_token_ids)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_counter = itertools.count()

    def _eos_token_ids(self, model_path: str) -> frozenset[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        if (Path(model_path) / "generation_config.json").is_file():
            eos = GenerationConfig.from_pretrained(model_path).eos_token_id
            ids.update([eos] if isinstance(eos, int) else (eos or []))
        return frozenset(ids)

    # ------------------------------------------------------------------ public API

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Complete each prompt; outputs come back in input order. A prompt or parameter the engine
        cannot take yields an output with ``error`` set and no completions; the others still run."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params_list = self._params_per_prompt(sampling_params, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        results: list[RequestOutput | None] = [None] * len(prompts)
        order: dict[str, int] = {}
        for i, (prompt, params) in enumerate(zip(prompts, params_list)):
            request_id = str(next(self._request_counter))
            try:
                self.add_request(request_id, prompt, params, priority=priority[i] if priority else 0)
                order[request_id] = i
            except ValueError as error:
                logger.warning("request %d rejected: %s", i, error)
                results[i] = self._error_output(request_id, prompt, str(error))
        for output in self._run_engine(len(order), use_tqdm):
            results[order[output.request_id]] = output
        return results

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the tokenizer's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [{"prompt_token_ids": self.apply_chat_template(c, chat_template, add_generation_prompt), "prompt": None} for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def apply_chat_template(self, conversation: list[dict[str, str]], chat_template: str | None = None, add_generation_prompt: bool = True) -> list[int]:
        if chat_template is None and not self.tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat_template; pass chat_template=...")
        text = self.tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def get_stats(self) -> SchedulerStats:
        """Scheduler and KV cache counters: blocks free, preemptions, prefix-cache hits, tokens computed."""
        return self.engine.stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    # ------------------------------------------------------------------ requests

    def _params_per_prompt(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [SamplingParams()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if len(sampling_params) != count:
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for {count} prompts")
        return list(sampling_params)

    def tokenize_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            return prompt.get("prompt"), list(prompt["prompt_token_ids"])
        if isinstance(prompt, dict) and "prompt" in prompt:
            return prompt["prompt"], self.tokenizer.encode(prompt["prompt"])
        raise ValueError("a prompt is a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}")

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Check a request against this engine's limits; returns its max_tokens."""
        max_len = self.config.model.max_model_len
        if not prompt_token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if len(prompt_token_ids) >= max_len:
            raise ValueError(
                f"prompt has {len(prompt_token_ids)} tokens; it must be shorter than max_model_len ({max_len}) "
                "to leave room for an output token"
            )
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids has ids outside [0, {self.vocab_size}): {bad[:5]}")
        bad = [t for t in params.stop_token_ids if t >= self.vocab_size]
        if bad:
            raise ValueError(f"stop_token_ids has ids outside [0, {self.vocab_size}): {bad[:5]}")
        if params.logprobs is not None and params.logprobs > self.config.model.max_logprobs:
            raise ValueError(f"logprobs ({params.logprobs}) must be <= max_logprobs ({self.config.model.max_logprobs})")
        room = max_len - len(prompt_token_ids)
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0) -> None:
        text, token_ids = self.tokenize_prompt(prompt)
        max_tokens = self.validate(token_ids, params)
        children = []
        for k in range(params.n):
            child_params = params.model_copy(update={"n": 1})
            if params.seed is not None and params.n > 1:
                child_params = child_params.model_copy(update={"seed": params.seed + k})
            children.append((request_id if params.n == 1 else f"{request_id}-{k}", child_params))
        self.output_processor.add_request(request_id, text, token_ids, children)
        for child_id, child_params in children:
            self.engine.add_request(
                Request(child_id, token_ids, child_params, max_tokens, self.eos_token_ids, priority=priority)
            )

    def _run_engine(self, num_requests: int, use_tqdm: bool):
        finished: list[RequestOutput] = []
        bar = tqdm(total=num_requests, desc="Processed prompts", unit="req", disable=not use_tqdm or num_requests == 0)
        num_output_tokens = 0
        while self.engine.has_unfinished_requests():
            core_outputs = self.engine.step()
            num_output_tokens += sum(len(o.new_token_ids) for o in core_outputs)
            outputs, to_abort = self.output_processor.process(core_outputs)
            if to_abort:
                self.engine.abort_requests(to_abort)
            for output in outputs:
                if output.finished:
                    finished.append(output)
                    bar.update(1)
            if bar.n and not bar.disable:
                bar.set_postfix_str(f"out {num_output_tokens / max(bar.format_dict['elapsed'], 1e-9):.1f} tok/s", refresh=False)
        bar.close()
        return finished

    @staticmethod
    def _error_output(request_id: str, prompt: PromptType, error: str) -> RequestOutput:
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
        token_ids = prompt.get("prompt_token_ids", []) if isinstance(prompt, dict) else []
        return RequestOutput(request_id, text, list(token_ids) if isinstance(token_ids, list) else [], [], True, error=error)
