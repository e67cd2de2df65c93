"""Turns the last-position logits of each request into its next token.

Order (vLLM's): raw logprobs (of the logits as they come: nothing below writes them, and they are read after the
draw), allowed_token_ids, bans (bad words, stop tokens before min_tokens)
and logit_bias, penalties (repetition, frequency, presence),
greedy argmax where temperature < 1e-5, temperature, min_p, top_k, top_p, then sample. Without min_p, top_k and
top_p the penalties are applied by the draw itself, as it reads the logits.
The draw is Gumbel-max (``kernels/sampling_ref.py``): argmax of logits / T plus Gumbel noise, which
samples from softmax(logits / T) exactly with no softmax. Each row's noise comes from a seed of its
own for this step (see ``row_seeds``), so a seeded request's tokens do not depend on what else is in
the batch. On a GPU one Triton kernel does the whole draw on the logits as they are (bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raygrid.engine.outputs import SampleLogprobs
from raygrid.engine.staging import to_host
from raygrid.kernels import ops
from raygrid.kernels.sampling_ref import Penalties


@dataclass
class SamplingMetadata:
    """Per-row sampling parameters of one step, as tensors on the logits' device."""

    temperature: torch.Tensor  # [B] float32
    greedy: torch.Tensor  # [B] bool
    all_greedy: bool
    top_k: torch.Tensor | None  # [B] int64, vocab size where disabled; None when no row uses it
    top_p: torch.Tensor | None  # [B] float32; None when no row uses it
    min_p: torch.Tensor | None  # [B] float32; None when no row uses it
    # Penalties: None when no row uses any.
    repetition_penalty: torch.Tensor | None  # [B]
    frequency_penalty: torch.Tensor | None  # [B]
    presence_penalty: torch.Tensor | None  # [B]
    # Each row's token statistics are a slot of engine/token_counts.py (the empty slot where it has no penalties).
    penalty_slots: torch.Tensor | None  # [B] int64
    slot_counts: torch.Tensor | None  # [S, V] float32 counts of each token among a slot's outputs
    slot_in_prompt: torch.Tensor | None  # [S, V] bool: True where the token is in the slot's prompt
    # Added to (row, token) before the penalties: -inf bans (bad words, stop tokens before min_tokens) and
    # logit_bias values; None when no row has any.
    adjust_rows: torch.Tensor | None
    adjust_tokens: torch.Tensor | None
    adjust_values: torch.Tensor | None  # float32
    # Rows restricted to their allowed_token_ids, and their [R, V] masks (0 allowed, -inf not); None if none.
    allowed_rows: torch.Tensor | None
    allowed_mask: torch.Tensor | None
    seeds: torch.Tensor  # [B] int64: this step's noise seed of each row
    num_logprobs: list[int | None]  # per row

    def penalties(self) -> Penalties | None:
        if self.repetition_penalty is None:
            return None
        return Penalties(self.slot_counts, self.slot_in_prompt, self.penalty_slots, self.repetition_penalty,
                         self.frequency_penalty, self.presence_penalty)

    @property
    def truncates(self) -> bool:
        """Whether any row keeps only some tokens (min_p, top_k, top_p), which needs the whole row's logits first."""
        return self.min_p is not None or self.top_k is not None or self.top_p is not None


class Sampler:
    def __call__(self, logits: torch.Tensor, meta: SamplingMetadata) -> tuple[torch.Tensor, "StepLogprobs | None"]:
        """The sampled tokens ``[B]`` and, where a row asks for logprobs, the step's logprobs, both on the device
        (nothing here waits for it: the host reads them with the tokens, PendingRunnerOutput)."""
        raw = logits  # logprobs are read from these after the draw: nothing below writes them
        if meta.allowed_rows is not None:
            logits = logits.float().index_add(0, meta.allowed_rows, meta.allowed_mask)
        if meta.adjust_rows is not None:
            logits = logits.float().index_put((meta.adjust_rows, meta.adjust_tokens), meta.adjust_values, accumulate=True)
        # The penalties go into the draw's pass, which reads each logit once in its dtype; truncation needs them first.
        penalties = meta.penalties()
        if penalties is not None and meta.truncates:  # in place: on a copy where these are still the raw logits
            logits, penalties = ops.apply_penalties(logits.to(torch.float32, copy=logits is raw), penalties), None

        if meta.all_greedy and penalties is None:
            sampled = logits.argmax(dim=-1)
        else:
            temperature = meta.temperature
            if meta.truncates:
                # Truncation acts on the tempered distribution, so temper first and draw at temperature 1
                # (greedy rows: temperature 0, an argmax, which truncation never changes).
                logits = logits.float() / torch.where(meta.greedy, 1.0, temperature).unsqueeze(1)
                if meta.min_p is not None:
                    logits = apply_min_p(logits, meta.min_p)
                if meta.top_k is not None or meta.top_p is not None:
                    logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
                temperature = torch.where(meta.greedy, 0.0, 1.0)
            sampled = ops.gumbel_argmax(logits, temperature, meta.seeds, penalties)

        want_logprobs = any(n is not None for n in meta.num_logprobs)
        return sampled, StepLogprobs.of(raw, sampled, meta.num_logprobs) if want_logprobs else None


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def row_seeds(request_seeds: np.ndarray, seeded: np.ndarray, positions: np.ndarray, fresh: np.ndarray) -> np.ndarray:
    """This step's noise seed of each row. A request with a seed gets a hash (SplitMix64) of its seed (any
    int64) and the position of the token being sampled, so its k-th token is drawn from the same noise
    whatever the batch, and again after a preemption; rows not ``seeded`` take ``fresh``."""
    if not seeded.any():  # the common case: no hashing
        return fresh
    z = request_seeds.astype(np.uint64) + positions.astype(np.uint64) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.where(seeded, (z >> np.uint64(1)).astype(np.int64), fresh)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    vocab = logits.shape[-1]
    if top_k is not None:
        # Keep the k largest: everything below the k-th largest value goes.
        kth_index = (vocab - top_k.clamp(1, vocab)).unsqueeze(1)
        kth_value = sorted_logits.gather(1, kth_index)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))
    if top_p is not None:
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p).unsqueeze(1)
        drop[:, -1] = False  # the most likely token always stays
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


@dataclass
class StepLogprobs:
    """Logprobs of a step's sampled rows, as tensors: each row's sampled token's logprob and rank, and the top
    ``max(num_logprobs)`` tokens and logprobs. They stay on the device until the host reads the step's tokens, so
    asking for logprobs does not make the host wait for the step (``to_host``, then ``entries``)."""

    top_ids: torch.Tensor  # [B, k]
    top_values: torch.Tensor  # [B, k] float32
    sampled_values: torch.Tensor  # [B]
    ranks: torch.Tensor  # [B] 1-based rank of the sampled token among all tokens
    num_logprobs: list[int | None]  # per row; None: the row did not ask

    @classmethod
    def of(cls, logits: torch.Tensor, sampled: torch.Tensor, num_logprobs: list[int | None]) -> "StepLogprobs":
        """From the raw ``logits`` in their dtype: a logprob is a logit minus its row's log-sum-exp, in float32 (one
        pass for the row statistics and the top-k's, and no ``[B, V]`` float32 copy or log-softmax)."""
        k = max(n for n in num_logprobs if n is not None)
        lse, sampled_logits, ranks = ops.logprob_stats(logits, sampled)
        if k > 0:
            top_logits, top_ids = logits.topk(k, dim=-1)
            top_values = top_logits.float() - lse.unsqueeze(1)
        else:
            top_values, top_ids = lse[:, None][:, :0], sampled[:, None][:, :0]
        return cls(top_ids, top_values, sampled_logits - lse, ranks, num_logprobs)

    def to_host(self) -> "StepLogprobs":
        """A copy in pinned host memory, queued on the current stream (valid once the stream reaches it)."""
        return StepLogprobs(to_host(self.top_ids), to_host(self.top_values), to_host(self.sampled_values), to_host(self.ranks),
                            self.num_logprobs)

    def entries(self, sampled_ids: list[int]) -> list[SampleLogprobs | None]:
        """One entry a row (None where it did not ask), its sampled token first: reads the tensors."""
        top_values, top_ids = self.top_values.tolist(), self.top_ids.tolist()
        sampled_values, ranks = self.sampled_values.tolist(), self.ranks.tolist()
        return [None if n is None else SampleLogprobs(token_ids=[sampled_ids[row]] + top_ids[row][:n],
                                                      logprobs=[sampled_values[row]] + top_values[row][:n],
                                                      sampled_rank=ranks[row])
                for row, n in enumerate(self.num_logprobs)]


def gather_logprobs(logits: torch.Tensor, sampled: torch.Tensor, num_logprobs: list[int | None]) -> list[SampleLogprobs | None]:
    """``StepLogprobs`` read at once (it waits for the device): prompt logprobs, which the host needs now."""
    return StepLogprobs.of(logits, sampled, num_logprobs).entries(sampled.tolist())
