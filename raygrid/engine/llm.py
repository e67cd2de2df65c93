"""LLM: the offline front end (vLLM's interface). Tokenize, run the engine to completion, detokenize."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.input_processor import PromptType
from raygrid.engine.llm_engine import LLMEngine
from raygrid.engine.outputs import RequestOutput
from raygrid.engine.sampling_params import SamplingParams
from raygrid.engine.scheduler import SchedulerStats

logger = logging.getLogger(__name__)


class LLM:
    """Generate text from prompts with one engine (one replica, or several on Ray).

    Takes vLLM's engine arguments, the fields of ``EngineArgs``: model, tokenizer, dtype, max_model_len,
    max_num_seqs, max_num_batched_tokens, block_size, num_kv_blocks, enable_prefix_caching,
    enable_chunked_prefill, scheduling_policy, gpu_memory_utilization, tensor_parallel_size, ... .
    It runs an ``LLMEngine`` to completion.

    >>> llm = LLM(model="tiny-random-qwen3")
    >>> outputs = llm.generate(["Hello"], SamplingParams(max_tokens=8))
    """

    def __init__(self, model: str, **engine_kwargs) -> None:
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **engine_kwargs))
        self.config = self.llm_engine.config
        self.processor = self.llm_engine.processor
        self.tokenizer = self.llm_engine.tokenizer
        self.engine = self.llm_engine.engine  # the EngineClient: stats, step timing, health

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
        elif not isinstance(prompts, Sequence):
            raise TypeError(f"prompts: a prompt (a string, {{'prompt': str}} or {{'prompt_token_ids': [int, ...]}}) or a "
                            f"list of them, not {type(prompts).__name__}")
        params_list = self._params_per_prompt(sampling_params, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority has {len(priority)} entries for {len(prompts)} prompts")
        results: list[RequestOutput | None] = [None] * len(prompts)
        order: dict[str, int] = {}
        for i, (prompt, params) in enumerate(zip(prompts, params_list)):
            request_id = self.llm_engine.next_request_id()
            try:
                self.llm_engine.add_request(request_id, prompt, params, priority=priority[i] if priority else 0)
                order[request_id] = i
            except (ValueError, RuntimeError) as error:  # bad input, or an engine that is lost
                logger.warning("request %d rejected: %s", i, error)
                results[i] = self._error_output(request_id, prompt, str(error), invalid=isinstance(error, ValueError))
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
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation or a list of them, through the tokenizer's chat template
        (``chat_template_kwargs`` and OpenAI-style ``tools`` reach the template). ``continue_final_message`` (with
        ``add_generation_prompt=False``) leaves the last message open for the model to continue. Each output's
        ``prompt`` is the rendered conversation."""
        conversations = [messages] if messages and _is_conversation(messages) else messages
        if not isinstance(conversations, (list, tuple)) or not all(_is_conversation(c) for c in conversations):
            raise TypeError(f"messages: a conversation (a list of {{'role': ..., 'content': ...}} dicts) or a list of them, "
                            f"not {_shape(messages)}")
        prompts = []
        for conversation in conversations:
            text, ids = self.processor.render_chat(conversation, chat_template, add_generation_prompt, continue_final_message,
                                                   tools=tools, **(chat_template_kwargs or {}))
            prompts.append({"prompt": text, "prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def get_tokenizer(self):
        """The Hugging Face tokenizer the engine tokenizes and detokenizes with."""
        return self.llm_engine.get_tokenizer()

    def get_default_sampling_params(self) -> SamplingParams:
        """What ``generate`` uses when given no SamplingParams: the checkpoint's generation_config.json
        defaults, as vLLM applies them."""
        return self.llm_engine.get_default_sampling_params()

    def get_stats(self) -> SchedulerStats:
        """Scheduler and KV cache counters: blocks free, preemptions, prefix-cache hits, tokens computed."""
        return self.engine.stats()

    def reset_prefix_cache(self) -> bool:
        return self.engine.reset_prefix_cache()

    def shutdown(self) -> None:
        """Release the engine's workers (Ray actors and their placement groups, if any)."""
        self.llm_engine.shutdown()

    # ------------------------------------------------------------------ the loop

    def _params_per_prompt(self, sampling_params, count: int) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        if not isinstance(sampling_params, Sequence):
            raise TypeError(f"sampling_params: a SamplingParams or a list of them, not {type(sampling_params).__name__}")
        if other := next((p for p in sampling_params if not isinstance(p, SamplingParams)), None):
            raise TypeError(f"sampling_params: a list of SamplingParams, not of {type(other).__name__}")
        if len(sampling_params) != count:
            raise ValueError(f"sampling_params has {len(sampling_params)} entries for {count} prompts")
        return list(sampling_params)

    def _run_engine(self, num_requests: int, use_tqdm: bool) -> list[RequestOutput]:
        finished: list[RequestOutput] = []
        bar = tqdm(total=num_requests, desc="Processed prompts", unit="req", disable=not use_tqdm or num_requests == 0)
        engine, tokens_before = self.llm_engine, self.llm_engine.num_generated_tokens
        while engine.has_unfinished_requests():
            for output in engine.step(emit_unfinished=False):
                if output.finished:
                    finished.append(output)
                    bar.update(1)
            if bar.n and not bar.disable:
                rate = (engine.num_generated_tokens - tokens_before) / max(bar.format_dict["elapsed"], 1e-9)
                bar.set_postfix_str(f"out {rate:.1f} tok/s", refresh=False)
        bar.close()
        return finished

    @staticmethod
    def _error_output(request_id: str, prompt: PromptType, error: str, invalid: bool) -> RequestOutput:
        text = prompt if isinstance(prompt, str) else (prompt.get("prompt") if isinstance(prompt, dict) else None)
        token_ids = prompt.get("prompt_token_ids", []) if isinstance(prompt, dict) else []
        return RequestOutput(request_id, text, list(token_ids) if isinstance(token_ids, list) else [], [], True, error=error,
                             invalid=invalid)


def _is_conversation(value) -> bool:
    """A list of message dicts."""
    return isinstance(value, (list, tuple)) and all(isinstance(m, dict) for m in value)


def _shape(value) -> str:
    """What was given where a conversation or a list of them was expected: 'str', 'list of str', 'list of list of str'."""
    if not isinstance(value, (list, tuple)) or not value:
        return type(value).__name__
    bad = next((v for v in value if not isinstance(v, dict) and not _is_conversation(v)), None)
    return f"{type(value).__name__} of {_shape(bad)}" if bad is not None else f"{type(value).__name__} of messages and conversations"
