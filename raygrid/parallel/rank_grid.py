"""The rank grid: how a world of ranks splits into tensor-, pipeline-, data- and expert-parallel groups.

vLLM's layout: ``arange(world).reshape(ExternalDP, DP, PP, TP)``. Tensor-parallel groups are the last
axis (neighbouring ranks, so one node's GPUs); pipeline groups come from swapping PP to the last axis,
data-parallel groups from swapping DP there; an expert-parallel group spans DP x TP of one PP stage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RankCoords:
    external_dp: int
    dp: int
    pp: int
    tp: int


@dataclass(frozen=True)
class RankGrid:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    external_dp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "external_dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} size must be >= 1, got {getattr(self, name)}")

    @property
    def world_size(self) -> int:
        return self.external_dp * self.dp * self.pp * self.tp

    def _layout(self) -> np.ndarray:
        return np.arange(self.world_size).reshape(self.external_dp, self.dp, self.pp, self.tp)

    @staticmethod
    def _groups(array: np.ndarray, size: int) -> list[list[int]]:
        return [list(map(int, row)) for row in array.reshape(-1, size)]

    def tp_groups(self) -> list[list[int]]:
        return self._groups(self._layout(), self.tp)

    def pp_groups(self) -> list[list[int]]:
        return self._groups(self._layout().transpose(0, 1, 3, 2), self.pp)

    def dp_groups(self) -> list[list[int]]:
        return self._groups(self._layout().transpose(0, 3, 2, 1), self.dp)

    def ep_groups(self) -> list[list[int]]:
        return self._groups(self._layout().transpose(0, 2, 1, 3), self.dp * self.tp)

    def coords(self, rank: int) -> RankCoords:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        e, d, p, t = (int(x) for x in np.argwhere(self._layout() == rank)[0])
        return RankCoords(e, d, p, t)

    def rank_of(self, external_dp: int = 0, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        return int(self._layout()[external_dp, dp, pp, tp])
