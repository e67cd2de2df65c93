"""Plain data that crosses boundaries: scheduler -> workers, workers -> scheduler, engine -> user.

SchedulerOutput is broadcast to every worker each step, so it stays small: new requests travel in
full once, running ones as deltas (new tokens, new blocks, progress).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from raygrid.engine.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    # True: the request was preempted and new_block_ids is its whole new block table.
    resumed_from_preemption: list[bool] = field(default_factory=list)
    new_token_ids: list[list[int]] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests the workers may forget (finished or aborted since the last step). A list: every rank removes
    # them in this order, so that all ranks' persistent batches keep the same rows. (A set would iterate in
    # each worker process's own string-hash order, and tensor-parallel ranks would then all-reduce
    # different requests' rows together.)
    finished_req_ids: list[str]
    # Numbers the scheduler's steps, so that their outputs can be matched to what was scheduled.
    step_id: int = 0
    # Structured outputs: the requests that sample under a grammar this step, and their rows of allowed
    # tokens (``grammar_bitmask()``). The scheduler gives a function that starts the fill; in one process the
    # engine starts it while the device runs the forward pass, and it becomes a Future, then the mask. A step
    # that leaves the process (pickled for a Ray worker) carries the filled mask.
    grammar_req_ids: list[str] = field(default_factory=list)
    fill_grammar_bitmask: Callable[[], Future] | Future | np.ndarray | None = field(default=None, repr=False)

    def start_grammar_fill(self) -> None:
        """Start filling the mask (the grammars must have seen every token before this step's)."""
        if callable(self.fill_grammar_bitmask):
            self.fill_grammar_bitmask = self.fill_grammar_bitmask()

    def grammar_bitmask(self) -> np.ndarray | None:
        """int32 ``[len(grammar_req_ids), ceil(vocab / 32)]``: bit t % 32 of word t // 32 set when token t is allowed."""
        self.start_grammar_fill()
        if isinstance(self.fill_grammar_bitmask, Future):
            self.fill_grammar_bitmask = self.fill_grammar_bitmask.result()
        return self.fill_grammar_bitmask

    def __getstate__(self) -> dict:
        self.grammar_bitmask()  # the matchers stay with the scheduler
        return self.__dict__

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


class SampleLogprobs(msgspec.Struct, array_like=True, gc=False):
    """Logprobs of one sampled position: the sampled token first, then the top-k."""

    token_ids: list[int]
    logprobs: list[float]
    sampled_rank: int  # 1-based rank of the sampled token among all tokens


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    # One list per request; empty when the request only computed part of its prompt this step.
    sampled_token_ids: list[list[int]]
    logprobs: list[SampleLogprobs | None]
    # Seconds the worker spent on this step (inputs, forward, sampling), for overhead accounting.
    execute_seconds: float = 0.0
    # Requests the worker could not take (what validation missed), with the reason: they alone fail.
    errors: dict[str, str] = field(default_factory=dict)
    # Requests with prompt_logprobs whose prompt this step computed: (the prompt position the first entry
    # is for, one entry per prompt token predicted, the predicted token first).
    prompt_logprobs: dict[str, tuple[int, list[SampleLogprobs]]] = field(default_factory=dict)
    # The EPLB rebalance that ran since the last output, if one did (parallel/eplb.py's RebalanceReport).
    eplb: Any = None


class EngineCoreOutput(msgspec.Struct, array_like=True, gc=False):
    """A request's news from one engine step. A msgspec Struct: the engine process sends a step's worth to
    the API servers as MessagePack, which decodes about 6x faster than pickled dataclasses."""

    req_id: str
    new_token_ids: list[int]
    new_logprobs: list[SampleLogprobs]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    # Seconds between arrival and first being scheduled; set on a request's first output only.
    queue_time: float | None = None
    # Set when the request failed in the engine (a worker died); finish_reason is then "abort".
    error: str | None = None
    # prompt_logprobs: the entries of the prompt tokens this step computed, in order (prompt token 1 first).
    new_prompt_logprobs: list[SampleLogprobs] = msgspec.field(default_factory=list)
    # With error: the error is the request's own (its grammar, or constraints that leave no token to sample),
    # not the engine's; a server answers 400 for it, not 500.
    invalid: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    # Set when the request was rejected (bad prompt or parameters) or failed in the engine.
    error: str | None = None
    # With SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing predicts it).
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    # With error: the request's own fault (EngineCoreOutput.invalid), not the engine's.
    invalid: bool = False

    def add(self, later: RequestOutput) -> None:
        """Fold a later delta output of the same request into this one (as vLLM's RequestOutput.add): each
        completion's new text, tokens and logprobs are appended, and the later finish state wins."""
        if later.prompt_logprobs is not None:  # each output carries the prompt's entries so far
            self.prompt_logprobs = later.prompt_logprobs
        mine = {c.index: c for c in self.outputs}
        for new in later.outputs:
            old = mine.get(new.index)
            if old is None:
                old = mine[new.index] = CompletionOutput(new.index, "", [], None, [] if new.logprobs is not None else None)
                self.outputs.append(old)
                self.outputs.sort(key=lambda c: c.index)
            # Each delta's lists are its own (slices made for it by the output processor): extended in place.
            old.text += new.text
            old.token_ids.extend(new.token_ids)
            if new.logprobs is not None:
                old.logprobs.extend(new.logprobs)
            old.cumulative_logprob = new.cumulative_logprob
            old.finish_reason, old.stop_reason = new.finish_reason, new.stop_reason
        self.finished = later.finished
        self.num_cached_tokens = max(self.num_cached_tokens, later.num_cached_tokens)
        self.error = later.error or self.error
        self.invalid = later.invalid or self.invalid


encode_outputs = msgspec.msgpack.Encoder().encode  # list[EngineCoreOutput] -> bytes, between processes
decode_outputs = msgspec.msgpack.Decoder(list[EngineCoreOutput]).decode
