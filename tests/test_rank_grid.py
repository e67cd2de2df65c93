"""The rank grid's groups against hand-written expectations (vLLM's layout)."""

from __future__ import annotations

import pytest

from raygrid.parallel.layers import _divide
from raygrid.parallel.rank_grid import RankCoords, RankGrid
from raygrid.models.llama import stage_layers


def test_tp2_pp2_dp2():
    grid = RankGrid(tp=2, pp=2, dp=2)
    assert grid.world_size == 8
    assert grid.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert grid.pp_groups() == [[0, 2], [1, 3], [4, 6], [5, 7]]
    # DP groups swap DP with the TP axis (vLLM: transpose(1, 3)), so TP is the outer loop.
    assert grid.dp_groups() == [[0, 4], [2, 6], [1, 5], [3, 7]]
    assert grid.ep_groups() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert grid.coords(6) == RankCoords(external_dp=0, dp=1, pp=1, tp=0)
    assert grid.rank_of(dp=1, pp=0, tp=1) == 5


def test_tp4_pp2():
    grid = RankGrid(tp=4, pp=2)
    assert grid.tp_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert grid.pp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(grid.dp_groups()) == [[r] for r in range(8)]  # one rank each, in transposed order


def test_tp2_dp3_with_external_dp2():
    grid = RankGrid(tp=2, dp=3, external_dp=2)
    assert grid.world_size == 12
    assert grid.tp_groups() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert grid.dp_groups() == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11]]
    assert grid.pp_groups() == [[r] for r in range(12)]
    assert grid.ep_groups() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


def test_single_rank_and_bad_sizes():
    assert RankGrid().tp_groups() == [[0]]
    with pytest.raises(ValueError, match="tp size"):
        RankGrid(tp=0)
    with pytest.raises(ValueError, match="rank 4 outside"):
        RankGrid(tp=2, pp=2).coords(4)


def test_pipeline_stages_split_layers_evenly():
    assert [list(stage_layers(28, s, 4)) for s in range(4)] == [list(range(i * 7, i * 7 + 7)) for i in range(4)]
    assert [len(stage_layers(5, s, 2)) for s in range(2)] == [3, 2]
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        stage_layers(2, 0, 3)
    with pytest.raises(ValueError, match="num_attention_heads"):
        _divide(6, 4, "num_attention_heads")
