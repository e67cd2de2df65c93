"""The sampler's inputs for a step: each row's sampling parameters on the device, the penalties' token counts
(kept on the device, engine/token_counts.py), the bans, biases and allowed tokens, and each row's noise seed. Under
async scheduling a row's newest token may still be on the device; what depends on it is resolved there, from the
previous step's samples. Nothing here waits for the device (engine/staging.py): the host builds a step's inputs
while the step before still runs."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from raygrid.engine.input_batch import InputBatch
from raygrid.engine.sampler import SamplingMetadata, row_seeds
from raygrid.engine.staging import StagingBuffers, to_device
from raygrid.engine.token_counts import TokenCounts


class SamplingInputs:
    def __init__(self, staging: StagingBuffers, device: torch.device, vocab_size: int, seed: int, max_reqs: int) -> None:
        self.staging = staging
        self.device = device
        self.vocab_size = vocab_size
        self.token_counts = TokenCounts(max_reqs, vocab_size, device)
        # Noise seeds of requests without a seed of their own. Every tensor-parallel rank draws the same
        # ones (same engine seed, one draw per step), so all ranks sample the same tokens.
        self.seed_rng = np.random.default_rng(seed)
        self._last_params: _RowParams | None = None

    def build(self, b: InputBatch, rows: np.ndarray, positions: np.ndarray, prev_sampled: torch.Tensor | None,
              prev_sampled_index: dict[str, int]) -> SamplingMetadata:
        """Sampling parameters of ``rows``, whose next tokens go to ``positions``.

        Under async scheduling a row's last token may still be on the device (sampled by the step
        before, which the host has not seen): ``positions`` counts it, and so do the penalty counts
        and the min_tokens check, so that async computes what synchronous scheduling computes."""
        params, param_arrays = self._row_params(b, rows)
        slots = (self.token_counts.slots(b, rows, positions, params.penalized, prev_sampled, prev_sampled_index)
                 if params.penalized is not None else None)
        adjust = self._logit_adjustments(b, rows, positions, prev_sampled, prev_sampled_index)
        seeds = row_seeds(b.seed[rows], b.seeded[rows], positions, self.seed_rng.integers(0, 2**63 - 1, size=len(rows), dtype=np.int64))
        # Pinned and asynchronous, in one copy (with the rows' parameters where they changed): a pageable copy would
        # wait for the running step.
        staged = self.staging.stage(**param_arrays, penalty_slots=slots, seeds=seeds)
        if param_arrays:  # staged now: the steps after this one read them where they are
            params.fields = {name: staged[name] for name, array in param_arrays.items() if array is not None}
        fields = params.fields
        counts, in_prompt = self.token_counts.buffers() if params.penalized is not None else (None, None)
        return SamplingMetadata(
            temperature=fields["temperature"],
            greedy=fields["greedy"],
            all_greedy=params.all_greedy,
            top_k=fields.get("top_k"),
            top_p=fields.get("top_p"),
            min_p=fields.get("min_p"),
            repetition_penalty=fields.get("repetition_penalty"),
            frequency_penalty=fields.get("frequency_penalty"),
            presence_penalty=fields.get("presence_penalty"),
            penalty_slots=staged.get("penalty_slots"),
            slot_counts=counts,
            slot_in_prompt=in_prompt,
            **adjust,
            seeds=staged["seeds"],
            num_logprobs=params.num_logprobs,
        )

    def _row_params(self, b: InputBatch, rows: np.ndarray) -> tuple["_RowParams", dict[str, np.ndarray | None]]:
        """The rows' parameters that stay while the batch does (temperature, truncation, penalties, logprobs), and the
        arrays to stage for them: none while the batch and its sampled rows are those of the step before, whose
        device fields still hold them (each field keeps its place, and nothing else writes it). A decode step of an
        unchanged batch then stages only its seeds and penalty slots."""
        key = (b.version, rows.tobytes())
        last = self._last_params
        if last is not None and last.key == key and last.batch() is b:
            return last, {}
        temperature = b.temperature[rows]
        greedy = temperature < 1e-5
        top_k, top_p, min_p = b.top_k[rows], b.top_p[rows], b.min_p[rows]
        penalized = (b.repetition_penalty[rows] != 1) | (b.frequency_penalty[rows] != 0) | (b.presence_penalty[rows] != 0)
        use_penalties = bool(penalized.any())
        arrays = dict(
            temperature=temperature, greedy=greedy,
            top_k=np.where(top_k > 0, top_k, self.vocab_size) if (top_k > 0).any() else None,
            top_p=top_p if (top_p < 1).any() else None,
            min_p=min_p if (min_p > 0).any() else None,
            repetition_penalty=b.repetition_penalty[rows] if use_penalties else None,
            frequency_penalty=b.frequency_penalty[rows] if use_penalties else None,
            presence_penalty=b.presence_penalty[rows] if use_penalties else None,
        )
        params = _RowParams(key, weakref.ref(b), bool(greedy.all()), penalized if use_penalties else None,
                            [b.states[row].sampling_params.logprobs for row in rows.tolist()], {})
        self._last_params = params
        return params, arrays

    def record(self, meta: SamplingMetadata, tokens: torch.Tensor) -> None:
        """Count a step's sampled tokens for the penalties (on the device, queued after the sampling)."""
        if meta.penalty_slots is not None:
            self.token_counts.record(meta.penalty_slots, tokens)

    def _logit_adjustments(self, b: InputBatch, rows: np.ndarray, positions: np.ndarray, prev_sampled, prev_sampled_index) -> dict:
        """The SamplingMetadata fields of the batch's bans, biases and allowed tokens, on the device. A ban
        that depends on a row's newest output, still on the device under async scheduling, is resolved
        there against the previous step's samples."""
        fields = dict(adjust_rows=None, adjust_tokens=None, adjust_values=None, allowed_rows=None, allowed_mask=None)
        if not b.adjusts[rows].any():  # the common case: no row bans, biases or restricts a token
            return fields
        adjust = b.logit_adjustments(rows, positions)
        dev, vocab = self.device, self.vocab_size
        if adjust.rows:
            values = to_device(adjust.values, np.float32, dev)
            if adjust.conditional:
                req_ids = b.req_ids
                sources = [prev_sampled_index[req_ids[rows[i]]] if need >= 0 else 0 for i, need in zip(adjust.rows, adjust.requires)]
                newest = prev_sampled[to_device(sources, np.int64, dev)]
                requires = to_device(adjust.requires, np.int64, dev)
                values = torch.where((requires < 0) | (newest == requires), values, torch.zeros_like(values))
            fields.update(adjust_rows=to_device(adjust.rows, np.int64, dev),
                          adjust_tokens=to_device(adjust.tokens, np.int64, dev).clamp_(0, vocab - 1), adjust_values=values)
        if adjust.allowed:
            mask = torch.full((len(adjust.allowed), vocab), float("-inf"), device=dev)
            mask_rows = [k for k, (_, ids) in enumerate(adjust.allowed) for _ in ids]
            mask_tokens = [t for _, ids in adjust.allowed for t in ids]
            # A tensor on the device, not ``= 0.0``: a Python scalar is copied over from pageable memory, which waits.
            mask.index_put_((to_device(mask_rows, np.int64, dev), to_device(mask_tokens, np.int64, dev).clamp_(0, vocab - 1)),
                            torch.zeros(len(mask_tokens), device=dev))
            fields.update(allowed_rows=to_device([i for i, _ in adjust.allowed], np.int64, dev), allowed_mask=mask)
        return fields


@dataclass
class _RowParams:
    """What ``SamplingInputs.build`` took from a step's sampled rows' parameters, for the steps after it while the batch
    and the rows stay (``key``: the batch's version and the rows)."""

    key: tuple[int, bytes]
    batch: weakref.ref
    all_greedy: bool
    penalized: np.ndarray | None  # per row; None where no row has a penalty
    num_logprobs: list[int | None]
    fields: dict[str, torch.Tensor]  # their fields' device views, once staged
