"""The persistent batch: the worker-side state of every request in flight, in numpy rows.

Requests keep their row from step to step; a step only appends the new token ids and block ids, so
building the model's inputs is a few vectorized gathers instead of Python loops over tokens.
Rows are kept dense: removing a request moves the last row into its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raygrid.engine.sampling_params import SamplingParams


@dataclass
class LogitAdjustments:
    """Additions to one step's logits: ``values[k]`` goes to (row ``rows[k]``, token ``tokens[k]``), but
    only where ``requires[k]`` is -1 or equals the row's newest output token; ``allowed`` lists, per row,
    the only tokens it may sample."""

    rows: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    requires: list[int] = field(default_factory=list)
    allowed: list[tuple[int, list[int]]] = field(default_factory=list)

    def add(self, row: int, tokens: list[int], value: float, requires: int = -1) -> None:
        self.rows += [row] * len(tokens)
        self.tokens += tokens
        self.values += [value] * len(tokens)
        self.requires += [requires] * len(tokens)

    @property
    def conditional(self) -> bool:
        return any(r >= 0 for r in self.requires)


@dataclass
class CachedRequestState:
    """A request as the worker knows it; kept while the request is preempted, dropped when finished."""

    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int, eos_token_ids: frozenset[int]) -> None:
        self.max_num_reqs = max_num_reqs
        self.eos_token_ids = eos_token_ids
        self.req_ids: list[str] = []
        self.index_of: dict[str, int] = {}
        self.states: list[CachedRequestState] = []
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, max_blocks_per_req), dtype=np.int64)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        # Sampling parameters per row, gathered into tensors each step.
        self.temperature = np.zeros(max_num_reqs, dtype=np.float32)
        self.top_p = np.ones(max_num_reqs, dtype=np.float32)
        self.top_k = np.zeros(max_num_reqs, dtype=np.int64)
        self.min_p = np.zeros(max_num_reqs, dtype=np.float32)
        self.repetition_penalty = np.ones(max_num_reqs, dtype=np.float32)
        self.frequency_penalty = np.zeros(max_num_reqs, dtype=np.float32)
        self.presence_penalty = np.zeros(max_num_reqs, dtype=np.float32)
        self.seed = np.zeros(max_num_reqs, dtype=np.int64)
        self.seeded = np.zeros(max_num_reqs, dtype=bool)  # False: the request has no seed
        # Whether a row's parameters may add to its logits (min_tokens, bad words, logit_bias, allowed tokens):
        # logit_adjustments looks only at these rows, not at every row of every step.
        self.adjusts = np.zeros(max_num_reqs, dtype=bool)
        # Which entry into the batch a row is (a request that leaves and comes back is a new entry), and a count of
        # the batch's changes: state kept elsewhere by row (engine/token_counts.py) follows entries, not rows.
        self.entry = np.zeros(max_num_reqs, dtype=np.int64)
        self.version = 0
        self._entries = 0

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def __contains__(self, req_id: str) -> bool:
        return req_id in self.index_of

    def add(self, state: CachedRequestState) -> None:
        if self.num_reqs >= self.max_num_reqs:
            raise RuntimeError(f"persistent batch is full ({self.max_num_reqs} rows)")
        row = self.num_reqs
        n = len(state.token_ids)
        self.token_ids[row, :n] = state.token_ids
        self.num_tokens[row] = n
        self.num_prompt_tokens[row] = state.num_prompt_tokens
        self.num_computed_tokens[row] = state.num_computed_tokens
        self.block_table[row, : len(state.block_ids)] = state.block_ids
        self.num_blocks[row] = len(state.block_ids)
        p = state.sampling_params
        self.temperature[row] = p.temperature
        self.top_p[row] = p.top_p
        self.top_k[row] = p.top_k if p.top_k_enabled else 0
        self.min_p[row] = p.min_p
        self.repetition_penalty[row] = p.repetition_penalty
        self.frequency_penalty[row] = p.frequency_penalty
        self.presence_penalty[row] = p.presence_penalty
        self.seed[row] = p.seed or 0
        self.seeded[row] = p.seed is not None
        self.adjusts[row] = bool(p.min_tokens or p.bad_words_token_ids or p.logit_bias or p.allowed_token_ids is not None)
        # Last, once every value fitted: a request that fails above never becomes a row.
        self.req_ids.append(state.req_id)
        self.states.append(state)
        self.index_of[state.req_id] = row
        self.renew(state.req_id)

    def renew(self, req_id: str) -> None:
        """Make the request's row a new entry: on adding it, and when it resumes from preemption in the very step it
        was preempted (it keeps its row, but the scheduler dropped its tokens still in flight)."""
        self.entry[self.index_of[req_id]] = self._entries
        self._entries += 1
        self.version += 1

    def remove(self, req_id: str) -> None:
        row = self.index_of.pop(req_id, None)
        if row is None:
            return
        self.version += 1
        last = self.num_reqs - 1
        if row != last:
            self._move_row(last, row)
        self.req_ids.pop()
        self.states.pop()

    def _move_row(self, src: int, dst: int) -> None:
        for array in (
            self.token_ids, self.num_tokens, self.num_prompt_tokens, self.num_computed_tokens, self.block_table,
            self.num_blocks, self.temperature, self.top_p, self.top_k, self.min_p, self.repetition_penalty,
            self.frequency_penalty, self.presence_penalty, self.seed, self.seeded, self.adjusts, self.entry,
        ):
            array[dst] = array[src]
        self.req_ids[dst] = self.req_ids[src]
        self.states[dst] = self.states[src]
        self.index_of[self.req_ids[dst]] = dst

    def append_tokens(self, req_id: str, token_ids: list[int]) -> None:
        row = self.index_of[req_id]
        start = self.num_tokens[row]
        self.token_ids[row, start : start + len(token_ids)] = token_ids
        self.num_tokens[row] = start + len(token_ids)

    def append_one_token_each(self, rows: list[int], token_ids: list[int]) -> None:
        """``append_tokens`` of one token to each of ``rows`` (distinct), in one vectorized write: a decode step's
        common case."""
        rows_array = np.asarray(rows, dtype=np.int64)
        self.token_ids[rows_array, self.num_tokens[rows_array]] = token_ids
        self.num_tokens[rows_array] += 1

    def set_blocks(self, req_id: str, block_ids: list[int], replace: bool) -> None:
        row = self.index_of[req_id]
        start = 0 if replace else self.num_blocks[row]
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def logit_adjustments(self, rows: np.ndarray, positions: np.ndarray) -> "LogitAdjustments":
        """What the sampling parameters of ``rows`` add to their logits for the tokens going to ``positions``:
        bans (-inf) of EOS and stop tokens before min_tokens and of the last token of a bad word whose rest the
        outputs end with, the logit_bias values, and each row's allowed_token_ids.

        Under async scheduling a row's newest output may still be on the device (``positions`` is past the
        tokens known here). A bad word that would need that token is then banned on a condition: that the
        newest output equals the word's second-to-last token, which the sampler checks on the device."""
        adjust = LogitAdjustments()
        for i in np.flatnonzero(self.adjusts[rows]).tolist():
            row = int(rows[i])
            p = self.states[row].sampling_params
            num_prompt, known = int(self.num_prompt_tokens[row]), int(self.num_tokens[row])
            num_outputs = int(positions[i]) - num_prompt  # outputs before the token being sampled
            in_flight = int(positions[i]) > known  # the newest output is not known here yet
            if p.min_tokens and num_outputs < p.min_tokens:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else self.eos_token_ids)
                adjust.add(i, sorted(stops), float("-inf"))
            for seq in p.bad_words_token_ids:
                need = len(seq) - 1  # outputs that must precede the banned token
                if need > num_outputs:
                    continue
                host_need = need - 1 if in_flight and need else need
                tail = self.token_ids[row, known - host_need: known].tolist() if host_need else []
                if tail != seq[:host_need]:
                    continue
                if in_flight and need:
                    adjust.add(i, [seq[-1]], float("-inf"), requires=seq[-2])
                else:
                    adjust.add(i, [seq[-1]], float("-inf"))
            if p.logit_bias:
                for token, bias in p.logit_bias.items():
                    adjust.add(i, [token], bias)
            if p.allowed_token_ids is not None:
                adjust.allowed.append((i, p.allowed_token_ids))
        return adjust
