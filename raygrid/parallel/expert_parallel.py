"""Expert parallelism: how a MoE layer's tokens reach the experts of other ranks and come back.

Under expert parallelism the experts are split over the EP group, the DP x TP ranks of a pipeline stage,
while attention stays data parallel across the DP ranks (and tensor parallel within each). Each DP rank
brings its own tokens to a MoE layer, so the layer first gathers every DP rank's tokens, runs them through
the experts this rank holds, and sends each rank back the sum over all experts of its own tokens.

The DP ranks bring different numbers of tokens, so every forward pass starts by telling each other how
many (``exchange_dp_step``, a small all-gather on the CPU group, once a pass rather than once a layer), and
each rank pads to the largest count. When every rank's pass is decode only, they all replay the CUDA graph
of the same padded size instead. An idle DP rank still runs a pass (a dummy token, or a graph of padding
rows): the collectives of every layer need all ranks.

``AllGatherDispatcher`` is the simple dispatch: all-gather the tokens over DP, compute, reduce-scatter the
sums over DP, then all-reduce over TP (the TP ranks of a DP rank hold the same tokens and different
experts). An all-to-all dispatcher, sending each token only to the ranks that hold its experts, would
implement the same two methods.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from raygrid.parallel.groups import GroupCoordinator, get_dp_group, get_parallel_state, get_tp_group


@dataclass(frozen=True)
class DPTokens:
    """This forward pass's token count on every DP rank of the stage, and this rank's place among them;
    ``valid`` (optional): which rows of the gathered tokens are real, as a device tensor (a CUDA graph reads it
    from a static buffer)."""
    counts: tuple[int, ...]
    rank: int
    valid: torch.Tensor | None = None

    @property
    def padded(self) -> int:
        return max(self.counts)


@dataclass(frozen=True)
class DPStep:
    """What each DP rank of the stage runs in this pass: its tokens, and its rows if the pass is decode only
    and may replay a CUDA graph (-1 otherwise)."""
    counts: tuple[int, ...]
    decode_rows: tuple[int, ...]

    @property
    def all_decode(self) -> bool:
        """Every rank can replay a graph: they then replay the same size, the one that fits the most rows."""
        return all(rows >= 0 for rows in self.decode_rows)


_CURRENT: DPTokens | None = None


def expert_parallel_enabled() -> bool:
    return get_parallel_state().ep is not None


def exchange_dp_step(num_tokens: int, decode_rows: int) -> DPStep:
    """Tell the stage's other DP ranks what this pass runs, and hear what theirs do (a small all-gather on the
    CPU group, once a pass rather than once a layer)."""
    parts = get_dp_group().all_gather_ints([num_tokens, decode_rows])
    return DPStep(tuple(p[0] for p in parts), tuple(p[1] for p in parts))


@contextmanager
def dp_tokens(counts: tuple[int, ...], valid: torch.Tensor | None = None):
    """Around a forward pass under expert parallelism: the DP ranks' token counts its MoE layers pad to."""
    global _CURRENT
    _CURRENT = DPTokens(tuple(counts), get_dp_group().rank_in_group, valid)
    try:
        yield
    finally:
        _CURRENT = None


def current_dp_tokens() -> DPTokens:
    if _CURRENT is None:
        raise RuntimeError("a MoE layer ran under expert parallelism outside dp_tokens (the DP ranks' token counts are unknown)")
    return _CURRENT


def valid_rows(counts: tuple[int, ...], padded: int) -> np.ndarray:
    """Which rows of the gathered ``[dp * padded]`` tokens are real."""
    return (np.arange(padded)[None, :] < np.asarray(counts)[:, None]).reshape(-1)


class AllGatherDispatcher:
    """Dispatch by all-gather over DP; combine by reduce-scatter over DP and all-reduce over TP."""

    def __init__(self) -> None:
        self.dp: GroupCoordinator = get_dp_group()
        self.tp: GroupCoordinator = get_tp_group()

    def dispatch(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every DP rank's tokens, each rank's padded to the largest count: ``[dp * padded, H]``, and which rows
        are real tokens (a bool per row)."""
        tokens = current_dp_tokens()
        padded = tokens.padded
        if hidden.shape[0] < padded:
            hidden = torch.cat([hidden, hidden.new_zeros(padded - hidden.shape[0], hidden.shape[1])])
        gathered = self.dp.all_gather_into(hidden)
        valid = tokens.valid
        if valid is None:
            valid = torch.from_numpy(valid_rows(tokens.counts, padded)).to(hidden.device, non_blocking=True)
        return gathered, valid

    def combine(self, out: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """This rank's tokens, summed over the experts of every EP rank."""
        mine = self.dp.reduce_scatter(out)
        return self.tp.all_reduce(mine)[:num_tokens]
