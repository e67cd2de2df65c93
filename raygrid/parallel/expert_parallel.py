"""Expert parallelism: how a MoE layer's tokens reach the experts of other ranks and come back.

Under expert parallelism the experts are split over the EP group, the DP x TP ranks of a pipeline stage,
while attention stays data parallel across the DP ranks (and tensor parallel within each). Each DP rank
brings its own tokens to a MoE layer, so the layer first gathers every DP rank's tokens, runs them through
the experts this rank holds, and sends each rank back the sum over all experts of its own tokens.

The DP ranks bring different numbers of tokens, so every forward pass starts by telling each other how
many (``dp_forward``, a small all-gather on the CPU group, once a step rather than once a layer), and each
rank pads to the largest count. An idle DP rank still runs a forward pass of one dummy token: the
collectives of every layer need all ranks.

``AllGatherDispatcher`` is the simple dispatch: all-gather the tokens over DP, compute, reduce-scatter the
sums over DP, then all-reduce over TP (the TP ranks of a DP rank hold the same tokens and different
experts). An all-to-all dispatcher, sending each token only to the ranks that hold its experts, would
implement the same two methods.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from raygrid.parallel.groups import GroupCoordinator, get_dp_group, get_parallel_state, get_tp_group


@dataclass(frozen=True)
class DPTokens:
    """This forward pass's token count on every DP rank of the stage, and this rank's place among them."""
    counts: tuple[int, ...]
    rank: int

    @property
    def padded(self) -> int:
        return max(self.counts)


_CURRENT: DPTokens | None = None


def expert_parallel_enabled() -> bool:
    return get_parallel_state().ep is not None


@contextmanager
def dp_forward(num_tokens: int):
    """Around every forward pass under expert parallelism: agree with the other DP ranks on their token
    counts for this pass (a no-op without expert parallelism)."""
    global _CURRENT
    if not expert_parallel_enabled():
        yield
        return
    dp = get_dp_group()
    _CURRENT = DPTokens(tuple(dp.all_gather_ints(num_tokens)), dp.rank_in_group)
    try:
        yield
    finally:
        _CURRENT = None


def current_dp_tokens() -> DPTokens:
    if _CURRENT is None:
        raise RuntimeError("a MoE layer ran under expert parallelism outside dp_forward (the DP ranks' token counts are unknown)")
    return _CURRENT


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
        row = torch.arange(padded, device=hidden.device)
        counts = torch.tensor(tokens.counts, device=hidden.device)
        valid = (row[None, :] < counts[:, None]).flatten()
        return gathered, valid

    def combine(self, out: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """This rank's tokens, summed over the experts of every EP rank."""
        mine = self.dp.reduce_scatter(out)
        return self.tp.all_reduce(mine)[:num_tokens]
