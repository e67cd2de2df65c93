"""A step on its way: launched on the device, its sampled tokens still to come back to the host."""

from __future__ import annotations

import time

import numpy as np
import torch

from raygrid.engine.outputs import ModelRunnerOutput
from raygrid.engine.sampler import StepLogprobs
from raygrid.engine.staging import to_host


class PendingRunnerOutput:
    """A step whose sampled tokens are still being copied to the host. ``result()`` waits for them
    (the step's one host-device sync) and builds the ModelRunnerOutput."""

    def __init__(self, req_ids: list[str], sample_rows: np.ndarray, tokens: torch.Tensor | None,
                 logprobs: StepLogprobs | None = None, prompt_logprobs: dict | None = None) -> None:
        self._sample = None  # a deferred sampling launch (see ModelRunner.execute_model's defer_grammar)
        self.req_ids = req_ids
        self.prompt_logprobs = prompt_logprobs or {}
        self.sample_rows = sample_rows
        self._logprobs = None
        self.started: float | None = None  # when the worker took the step (perf_counter)
        self.errors: dict[str, str] = {}
        self.eplb = None  # an EPLB rebalance report to pass on
        self._host_tokens = None
        self._event = None
        self._copy_back(tokens, logprobs)

    @classmethod
    def deferred(cls, req_ids: list[str], sample_rows: np.ndarray, prompt_logprobs: dict, sample) -> "PendingRunnerOutput":
        """A step whose forward pass is launched and whose sampling waits for ``sample_now()``: ``sample`` launches
        it and returns (tokens, logprobs)."""
        pending = cls(req_ids, sample_rows, None, None, prompt_logprobs)
        pending._sample = sample
        return pending

    def sample_now(self) -> None:
        """Launch the deferred sampling (a no-op if there is none, or it already ran)."""
        if self._sample is not None:
            sample, self._sample = self._sample, None
            self._copy_back(*sample())

    def _copy_back(self, tokens: torch.Tensor | None, logprobs: StepLogprobs | None) -> None:
        """Queue the tokens' and logprobs' copies to the host, and an event after them."""
        if tokens is None:
            return
        self._host_tokens = to_host(tokens)
        self._logprobs = logprobs.to_host() if logprobs is not None else None
        if tokens.is_cuda:
            self._event = torch.cuda.Event()
            self._event.record()

    def result(self) -> ModelRunnerOutput:
        self.sample_now()
        sampled: list[list[int]] = [[] for _ in self.req_ids]
        logprobs = [None] * len(self.req_ids)
        if self._host_tokens is not None:
            if self._event is not None:
                self._event.synchronize()
            tokens = self._host_tokens.tolist()
            entries = self._logprobs.entries(tokens) if self._logprobs is not None else [None] * len(tokens)
            for row, token, lp in zip(self.sample_rows.tolist(), tokens, entries):
                sampled[row] = [token]
                logprobs[row] = lp
        # From taking the step to its tokens on the host: inputs, forward, sampling and the copy back.
        execute_seconds = time.perf_counter() - self.started if self.started is not None else 0.0
        return ModelRunnerOutput(self.req_ids, sampled, logprobs, execute_seconds=execute_seconds, errors=self.errors,
                                 prompt_logprobs=self.prompt_logprobs, eplb=self.eplb)
