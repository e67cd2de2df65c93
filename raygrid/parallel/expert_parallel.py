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

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from raygrid.parallel.groups import GroupCoordinator, get_dp_group, get_parallel_state, get_tp_group


@dataclass(frozen=True)
class DPTokens:
    """This forward pass's token count on every DP rank of the stage, and which rows of the gathered tokens are
    real (a device tensor, made once a pass; a CUDA graph reads it from a static buffer)."""
    counts: tuple[int, ...]
    valid: torch.Tensor

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
def dp_tokens(counts: tuple[int, ...], valid: torch.Tensor):
    """Around a forward pass under expert parallelism: the DP ranks' token counts its MoE layers pad to."""
    global _CURRENT
    _CURRENT = DPTokens(tuple(counts), valid)
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


@dataclass(frozen=True)
class PassPlan:
    """How one forward pass runs: the decode CUDA graph size it replays, or else the token count of the mixed
    graph or of the piecewise graphs it replays (all None: eagerly) and, for an eager pass under expert
    parallelism, the DP ranks' tokens its MoE layers pad to."""
    graph_size: int | None
    dp_tokens: DPTokens | None = None
    piecewise_size: int | None = None
    mixed_size: int | None = None

    def context(self):
        return dp_tokens(self.dp_tokens.counts, self.dp_tokens.valid) if self.dp_tokens is not None else nullcontext()


class PassPlanner:
    """Plans each forward pass of a model runner. Without expert parallelism a decode-only pass replays the
    graph that fits its rows. With it the DP ranks decide together (``exchange_dp_step``): a graph when every
    one of them can replay one, all the size that fits the most rows (the real rows go to a static buffer the
    graphs' MoE layers read), eagerly with everyone's counts otherwise."""

    def __init__(self, max_graph_batch: int, device: torch.device, uses_graphs: bool) -> None:
        self.device = device
        self.expert_parallel = expert_parallel_enabled()
        self.dp_size = get_dp_group().world_size
        self.valid = torch.zeros(self.dp_size * max_graph_batch, dtype=torch.bool, device=device) \
            if self.expert_parallel and uses_graphs else None

    def plan(self, graphs, num_tokens: int, decode_rows: int, piecewise=None, num_reqs: int = 0) -> PassPlan:
        """``graphs``: the runner's FullGraphs (None: none captured); ``decode_rows``: the pass's rows if it is
        decode only, else -1; ``piecewise``: the runner's PiecewiseGraphs (None: none captured; never under expert
        parallelism, whose eager passes pad to every DP rank's token count); ``num_reqs``: the pass's requests
        (for a mixed graph)."""
        replayable = graphs is not None and decode_rows >= 0
        if not self.expert_parallel:
            size = graphs.padded_size(decode_rows) if replayable else None
            if size is not None:
                return PassPlan(size)
            mixed = graphs.mixed_size(num_tokens, num_reqs) if graphs is not None and decode_rows < 0 else None
            if mixed is not None:
                return PassPlan(None, mixed_size=mixed)
            return PassPlan(None, piecewise_size=piecewise.padded_size(num_tokens) if piecewise is not None else None)
        step = exchange_dp_step(num_tokens, decode_rows if replayable else -1)
        size = graphs.padded_size(max(step.decode_rows)) if step.all_decode else None
        if size is None:
            valid = torch.from_numpy(valid_rows(step.counts, max(step.counts))).to(self.device, non_blocking=True)
            return PassPlan(None, DPTokens(step.counts, valid))
        self.valid[: self.dp_size * size].copy_(torch.from_numpy(valid_rows(step.decode_rows, size)))
        return PassPlan(size)

    def graph_context(self, size: int):
        """What a graph of ``size`` rows is captured under: every DP rank brings ``size`` rows."""
        if not self.expert_parallel:
            return nullcontext()
        return dp_tokens((size,) * self.dp_size, valid=self.valid[: self.dp_size * size])


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
        return self.dp.all_gather(hidden, dim=0), tokens.valid

    def combine(self, out: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """This rank's tokens, summed over the experts of every EP rank."""
        mine = self.dp.reduce_scatter(out)
        return self.tp.all_reduce(mine)[:num_tokens]
