"""What the penalties need to know of each request's tokens, kept on the device from step to step: how often each
vocabulary token occurs among its outputs, and whether it occurs in its prompt.

A request with penalties gets a slot when it first samples after entering the persistent batch. The slot is filled
once from the tokens the host knows (and, under async scheduling, the newest one, still on the device). After that,
each token the request samples is counted into its slot on the device, right after sampling, so a step sends no
token histories to the device and rebuilds no counts. A request that leaves the batch (finished, preempted or not
scheduled) gives its slot back, and is filled afresh if it returns: tokens sampled for it by a step in flight when
it left may be dropped by the scheduler, and must not stay counted. The same goes for a request preempted and
resumed within one schedule, which keeps its row (``InputBatch.renew`` makes it a new entry). Slots follow entries
(``InputBatch.entry``), not rows, so rows may move.
"""

from __future__ import annotations

import numpy as np
import torch

from raygrid.engine.input_batch import InputBatch
from raygrid.engine.staging import to_device


class TokenCounts:
    def __init__(self, max_reqs: int, vocab_size: int, device: torch.device) -> None:
        self.max_reqs, self.vocab_size, self.device = max_reqs, vocab_size, device
        self._counts: torch.Tensor | None = None  # [max_reqs + 1, V] float32; allocated on first use
        self._in_prompt: torch.Tensor | None = None  # [max_reqs + 1, V] bool
        self.empty_slot = max_reqs  # all zeros, never written: the slot of rows without penalties
        self.reset()

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The counts and prompt masks of every slot, allocated on first use (the memory profile's sampling pass uses
        them, so on a GPU they exist before the KV cache is sized)."""
        if self._counts is None:
            shape = (self.max_reqs + 1, self.vocab_size)
            self._counts = torch.zeros(shape, dtype=torch.float32, device=self.device)
            self._in_prompt = torch.zeros(shape, dtype=torch.bool, device=self.device)
        return self._counts, self._in_prompt

    def reset(self) -> None:
        """Every slot free (the batch starts over); the buffers stay, to be filled again."""
        self.slot_of: dict[int, int] = {}  # InputBatch.entry of a row -> its slot
        self._free = list(range(self.max_reqs - 1, -1, -1))
        self._batch_version = -1

    def slots(self, b: InputBatch, rows: np.ndarray, positions: np.ndarray, penalized: np.ndarray,
              prev_sampled: torch.Tensor | None, prev_sampled_index: dict[str, int]) -> np.ndarray:
        """Each row's slot (the empty slot where ``penalized`` is False); rows new to the counts are filled first. A
        row's outputs are those before ``positions``; one past the tokens the host knows is in ``prev_sampled``."""
        if b.version != self._batch_version:  # rows have left: their slots go back
            live = set(b.entry[: b.num_reqs].tolist())
            for entry in [e for e in self.slot_of if e not in live]:
                self._free.append(self.slot_of.pop(entry))
            self._batch_version = b.version
        penalized_rows = np.flatnonzero(penalized)
        entries = b.entry[rows[penalized_rows]].tolist()
        new = [k for k, entry in enumerate(entries) if entry not in self.slot_of]
        if new:
            fresh = penalized_rows[new]
            self._fill(b, rows[fresh], positions[fresh], [self._take(entries[k]) for k in new], prev_sampled, prev_sampled_index)
        slots = np.full(len(rows), self.empty_slot, dtype=np.int64)
        slots[penalized_rows] = [self.slot_of[entry] for entry in entries]
        return slots

    def _take(self, entry: int) -> int:
        slot = self._free.pop()
        self.slot_of[entry] = slot
        return slot

    def _fill(self, b: InputBatch, rows: np.ndarray, positions: np.ndarray, slots: list[int],
              prev_sampled: torch.Tensor | None, prev_sampled_index: dict[str, int]) -> None:
        counts_all, in_prompt_all = self.buffers()
        known = b.num_tokens[rows]
        dev = self.device
        counts, in_prompt = token_statistics(to_device(b.token_ids[rows, : int(known.max())], np.int64, dev),
                                             to_device(b.num_prompt_tokens[rows], np.int64, dev),
                                             to_device(known, np.int64, dev), self.vocab_size)
        in_flight = np.flatnonzero(positions > known)
        if len(in_flight):  # the newest output, sampled by the step before and not yet seen here
            sources = [prev_sampled_index[b.req_ids[int(rows[i])]] for i in in_flight.tolist()]
            tokens = prev_sampled[to_device(sources, np.int64, dev)]
            counts.index_put_((to_device(in_flight, np.int64, dev), tokens), torch.ones(len(sources), device=dev), accumulate=True)
        slots_dev = to_device(slots, np.int64, dev)
        counts_all[slots_dev] = counts
        in_prompt_all[slots_dev] = in_prompt

    def record(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count each row's sampled token into its slot (rows in the empty slot add nothing). A step samples a row
        once, so no slot appears twice."""
        counts, _ = self.buffers()
        counts.index_put_((slots, tokens), (slots != self.empty_slot).float(), accumulate=True)


def token_statistics(tokens: torch.Tensor, prompt_len: torch.Tensor, total_len: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens`` [B, L] holds each row's prompt then outputs, ``total_len`` of them valid. Returns the
    [B, V] float counts of each token among the outputs and the [B, V] mask of tokens in the prompt."""
    pos = torch.arange(tokens.shape[1], device=tokens.device)
    in_prompt = pos < prompt_len[:, None]
    in_output = ~in_prompt & (pos < total_len[:, None])
    tokens = tokens.clamp(0, vocab_size - 1)
    shape = (tokens.shape[0], vocab_size)
    counts = torch.zeros(shape, device=tokens.device).scatter_add_(1, tokens, in_output.float())
    prompt_mask = torch.zeros(shape, device=tokens.device).scatter_add_(1, tokens, in_prompt.float()) > 0
    return counts, prompt_mask
