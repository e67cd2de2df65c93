"""LLMEngine: vLLM's step-by-step offline API. ``add_request``, then ``step()`` until
``has_unfinished_requests()`` is False; each step returns the RequestOutputs that changed. ``LLM`` runs the
same loop to completion.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from raygrid.config import EngineConfig
from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.engine_client import create_engine
from raygrid.engine.input_processor import InputProcessor, PromptType
from raygrid.engine.output_processor import OutputProcessor
from raygrid.engine.outputs import RequestOutput
from raygrid.engine.sampling_params import SamplingParams


class LLMEngine:
    """Tokenizes and validates each request, runs the engine (in this process, or its replicas on Ray) and
    detokenizes. A request the engine cannot take raises from ``add_request`` (a ValueError naming the field)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.processor = InputProcessor(config)
        self.tokenizer = self.processor.tokenizer
        self.engine = create_engine(config, self.processor.eos_token_ids, grammars=self.processor.grammars)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.num_generated_tokens = 0  # output tokens the engine has returned so far
        self._request_counter = itertools.count()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams | None = None, priority: int = 0) -> None:
        """Queue a prompt (a string, {"prompt": str} or {"prompt_token_ids": [...]}); ``params`` defaults to the
        checkpoint's generation defaults."""
        processed = self.processor.process(request_id, prompt, params or self.get_default_sampling_params(), priority=priority)
        self.output_processor.add_request(processed)
        for child in processed.children:
            self.engine.add_request(child)

    def step(self, emit_unfinished: bool = True) -> list[RequestOutput]:
        """One engine step; returns the outputs of the requests it advanced (every one of them, or with
        ``emit_unfinished=False`` only those that finished). A stop string aborts its request in the engine."""
        core_outputs = self.engine.step()
        self.num_generated_tokens += sum(len(o.new_token_ids) for o in core_outputs)
        outputs, to_abort = self.output_processor.process(core_outputs, emit_unfinished=emit_unfinished)
        if to_abort:
            self.engine.abort_requests(to_abort)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """Stop requests (by the ids given to ``add_request``); unknown or finished ids are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        children = [child for rid in ids for child in self.output_processor.child_ids(rid)]
        for rid in ids:
            self.output_processor.abort(rid)
        if children:
            self.engine.abort_requests(children)

    def next_request_id(self) -> str:
        return str(next(self._request_counter))

    def get_tokenizer(self):
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.processor.default_sampling_params()

    def shutdown(self) -> None:
        self.engine.shutdown()
