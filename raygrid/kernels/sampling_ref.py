"""Torch reference of the last step of sampling: the Gumbel-max draw.

``argmax(logits / T + G)`` with ``G = -log(-log(U))``, ``U`` uniform, draws a token from
``softmax(logits / T)`` exactly, without computing the softmax. Rows with temperature below 1e-5 are
greedy (plain argmax). The Triton kernel in ``triton_sampling.py`` computes the same thing with ``U``
from a per-row Philox stream; given the same ``U`` both give the same token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

GREEDY_TEMPERATURE = 1e-5


class Penalties(NamedTuple):
    """The repetition, frequency and presence penalties of a batch's rows. Row i's token statistics are slot
    ``slots[i]`` of ``counts`` and ``in_prompt`` (engine/token_counts.py); a row without penalties has 1, 0 and 0."""

    counts: torch.Tensor  # [S, V] float32: each token's count among the slot's outputs
    in_prompt: torch.Tensor  # [S, V] bool: whether the token is in the slot's prompt
    slots: torch.Tensor  # [B] int64
    repetition: torch.Tensor  # [B] float32
    frequency: torch.Tensor  # [B] float32
    presence: torch.Tensor  # [B] float32


def gumbel_scores(logits: torch.Tensor, temperature: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """``[B, V]`` float64 scores whose row argmax is the draw: logits / T - log(-log U), or the plain logits
    on greedy rows. logits ``[B, V]`` (any float dtype), temperature ``[B]``, uniform ``[B, V]`` in [0, 1)."""
    logits = logits.double()
    greedy = (temperature < GREEDY_TEMPERATURE).unsqueeze(1)
    safe_temperature = torch.where(greedy, 1.0, temperature.double().unsqueeze(1))
    noisy = logits / safe_temperature - torch.log(-torch.log(uniform.double()))
    return torch.where(greedy, logits, noisy)


def gumbel_argmax_ref(logits: torch.Tensor, temperature: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The drawn token of each row: ``[B]`` int64."""
    return gumbel_scores(logits, temperature, uniform).argmax(dim=-1)


def seeded_uniform(seeds: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """``[len(seeds), vocab]`` uniforms, row i from a torch generator seeded with ``seeds[i]``: the
    CPU path's noise (the GPU kernel draws its own from Philox with the same seeds)."""
    rows = []
    for seed in seeds:
        generator = torch.Generator(device=device).manual_seed(seed)
        rows.append(torch.rand(vocab_size, generator=generator, device=device))
    return torch.stack(rows) if rows else torch.empty(0, vocab_size, device=device)


def apply_token_bitmask_ref(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, mask_rows: torch.Tensor) -> None:
    """Structured outputs: in place, ``logits[rows[i], t] = -inf`` where bit ``t % 32`` of word ``t // 32`` of
    ``bitmask[mask_rows[i]]`` is 0 (int32 words; ids past the bitmask are refused too)."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = ((bitmask[mask_rows].unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def apply_penalties_ref(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Repetition, frequency and presence penalties (vLLM's definitions) on float32 ``logits [B, V]``, in place. A
    token seen in the prompt or the outputs is divided by the repetition penalty where its logit is positive and
    multiplied by it elsewhere; then ``frequency * count`` and ``presence * (count > 0)`` are subtracted."""
    row_counts, seen = penalties.counts[penalties.slots], penalties.in_prompt[penalties.slots]
    present = row_counts > 0
    seen = seen | present
    rep = penalties.repetition.unsqueeze(1)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits.copy_(torch.where(seen, penalized, logits) - penalties.frequency.unsqueeze(1) * row_counts
                 - penalties.presence.unsqueeze(1) * present.float())
    return logits


def logprob_stats_ref(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What logprobs need of each row of raw ``logits [B, V]`` (any float dtype), in float32: the log of the
    softmax's denominator (so a token's logprob is its logit minus it), the logit of ``tokens[i]``, and that token's
    1-based rank (1 + the number of logits above it), int64."""
    x = logits.float()
    token_logits = x.gather(1, tokens.long().unsqueeze(1)).squeeze(1)
    return torch.logsumexp(x, dim=-1), token_logits, (x > token_logits.unsqueeze(1)).sum(dim=-1) + 1
