"""A request as the scheduler sees it: tokens, progress through them, and where it stands."""

from __future__ import annotations

import enum
import time

from raygrid.engine.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything after PREEMPTED is a finished state.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One sequence in the engine.

    The scheduler's whole view of progress is two numbers: ``num_tokens`` (prompt plus output so far)
    and ``num_computed_tokens`` (how many of them have KV in the cache). Each step it schedules enough
    tokens to close the gap, which covers prefill, chunked prefill, decode and recompute alike.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        max_tokens: int,
        eos_token_ids: frozenset[int] = frozenset(),
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        allowed = sampling_params.allowed_token_ids
        self.allowed_token_set = frozenset(allowed) if allowed is not None else None  # token_bans reads it each token
        # Whether the parameters ban tokens (token_bans checks each output token then; the others skip it).
        self.bans_tokens = allowed is not None or bool(sampling_params.min_tokens) or bool(sampling_params.bad_words_token_ids)
        self.max_tokens = max_tokens
        # End-of-sequence ids (tokenizer's and generation_config's); ignored with ignore_eos.
        self.eos_token_ids = eos_token_ids
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.cache_salt = cache_salt

        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        # Async scheduling: output tokens being sampled right now, already counted as scheduled.
        # Reset on preemption: outputs of an earlier incarnation are dropped.
        self.num_output_placeholders = 0
        # Prompt tokens found in the prefix cache the first time the request was scheduled (-1: not yet).
        self.num_cached_tokens = -1
        self.num_prompt_logprobs_sent = 0  # prompt_logprobs: prompt tokens whose entries went out (a recompute skips them)
        self.first_scheduled_time: float | None = None
        self.num_preemptions = 0  # also the incarnation: outputs of steps scheduled before a preemption are stale
        # Chained hashes of the full blocks of all_token_ids, filled in by the KV cache manager.
        self.block_hashes: list[bytes] = []
        # How many of all_token_ids the workers have been sent (they need each token once).
        self.num_tokens_sent = 0
        # Structured outputs: the grammar's compile (a Future), then its matcher, which every output token advances.
        self.grammar_future = None
        self.grammar = None

    @property
    def is_structured(self) -> bool:
        return self.sampling_params.structured_outputs is not None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
