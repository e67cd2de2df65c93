"""The EPLB algorithm (parallel/eplb.py): hand-computed placements, and properties on random loads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raygrid.parallel.eplb import ExpertMap, balancedness, nodes_in_blocks, initial_map, plan_layer, rank_loads, rebalance_experts, replica_tables
from raygrid.parallel.groups import GroupCoordinator


def test_eight_experts_four_redundant_slots_on_four_ranks_by_hand():
    """Expert 0 carries 90 of 200 tokens, expert 4 40. Replication: slot 8 to expert 0 (90/1 is the most per
    replica), slot 9 to expert 0 again (45 > 40), slot 10 to expert 4 (40 > 30), slot 11 to expert 0 (30 > 20).
    Per slot: 22.5 (x4, expert 0), 20 (x2 expert 4, and expert 7), 10 (the rest). Packing, heaviest first into
    the lightest rank with room: the four 22.5s open the four ranks, the 20s go to ranks 0-2, two 10s fill rank 3,
    the last three 10s ranks 0-2: loads 52.5, 52.5, 52.5, 42.5."""
    load = np.array([90, 10, 10, 10, 40, 10, 10, 20], dtype=float)
    new = rebalance_experts(load, num_physical=12, num_ranks=4)
    assert new.tolist() == [0, 4, 3, 0, 7, 5, 0, 4, 6, 0, 1, 2]
    assert rank_loads(new, load, 4).tolist() == [52.5, 52.5, 52.5, 42.5]
    assert balancedness(rank_loads(new, load, 4)) == pytest.approx(50 / 52.5)
    # The starting map (slot p holds expert p % 8) puts expert 0's two copies on ranks 0 and 2: 55, 55, 75, 15.
    start = initial_map(8, 12)
    assert rank_loads(start, load, 4).tolist() == [55, 55, 75, 15]
    chosen, before, after = plan_layer(load, start, 4)
    assert chosen.tolist() == new.tolist() and before == pytest.approx(50 / 75) and after == pytest.approx(50 / 52.5)


def test_no_redundant_slots_two_ranks_by_hand():
    """4 experts of loads 4, 3, 2, 1 on 2 ranks: 4 -> rank 0, 3 -> rank 1, 2 -> rank 1 (3 < 4), 1 -> rank 0."""
    new = rebalance_experts(np.array([4.0, 3.0, 2.0, 1.0]), num_physical=4, num_ranks=2)
    assert new.tolist() == [0, 3, 1, 2]
    assert balancedness(rank_loads(new, np.array([4.0, 3, 2, 1]), 2)) == 1.0


def test_nodes_count_only_when_they_hold_equal_consecutive_blocks_of_ranks():
    assert nodes_in_blocks(["a", "a", "b", "b"]) == 2 and nodes_in_blocks(["a"] * 4) == 1
    assert nodes_in_blocks(["a", "b", "a", "b"]) == 1 and nodes_in_blocks(["a", "a", "a", "b"]) == 1


def test_hierarchical_keeps_each_group_on_one_node():
    """8 experts in 4 groups of 2, 2 nodes of 2 ranks: groups are packed onto nodes by load (groups 0+3 and
    1+2 balance 10+1 against 6+5), and each node's slots hold only its groups' experts."""
    load = np.array([6, 4, 3, 3, 2, 3, 1, 0], dtype=float)  # group loads 10, 6, 5, 1
    new = rebalance_experts(load, num_physical=12, num_ranks=4, num_groups=4, num_nodes=2)
    node0, node1 = set(new[:6].tolist()), set(new[6:].tolist())
    assert node0 <= {0, 1, 6, 7} and node1 <= {2, 3, 4, 5}
    assert set(range(8)) <= node0 | node1


@pytest.mark.parametrize("hierarchical", [False, True], ids=["global", "hierarchical"])
def test_properties_on_random_loads(hierarchical):
    rng = np.random.default_rng(7)
    for trial in range(200):
        num_experts, ranks = 16, int(rng.choice([2, 4, 8]))
        num_physical = num_experts + ranks * int(rng.integers(0, 3))
        load = rng.pareto(1.2, num_experts) * rng.integers(1, 1000)
        kwargs = dict(num_groups=8, num_nodes=2) if hierarchical else {}
        new = rebalance_experts(load, num_physical, ranks, **kwargs)
        # Every logical expert keeps a replica; each rank holds exactly its slots.
        assert len(new) == num_physical
        assert set(new.tolist()) == set(range(num_experts)), trial
        to_physical, counts = replica_tables(new, num_experts, num_physical - num_experts + 1)
        assert counts.sum() == num_physical and (counts >= 1).all()
        assert all(sorted(to_physical[e, : counts[e]].tolist()) == np.nonzero(new == e)[0].tolist() for e in range(num_experts))
        # A rebalance never lowers balancedness on the window it was computed from, from any current map.
        current = rng.permutation(np.concatenate([np.arange(num_experts), rng.integers(0, num_experts, num_physical - num_experts)]))
        chosen, before, after = plan_layer(load, current, ranks, **kwargs)
        assert after >= before and balancedness(rank_loads(chosen, load, ranks)) == pytest.approx(after)


def test_an_experts_tokens_spread_over_its_replicas_and_each_pair_has_one_rank():
    """ExpertMap on two EP ranks of 3 slots: expert 0 on slots 0 (rank 0), 3 and 5 (rank 1), expert 1 on slot 1.
    90 tokens choose experts 0 and 1: expert 0's pairs split 30/30/30 over its replicas by token, every pair is
    served by exactly one rank, and each rank's window counts its own slots' real tokens (padding rows not)."""
    maps = [ExpertMap(4, 6, GroupCoordinator([0, 1], rank), window_size=2) for rank in (0, 1)]
    for m in maps:
        m.commit(np.array([0, 1, 2, 0, 3, 0]))
    ids = torch.tensor([[0, 1]] * 90 + [[2, 3]] * 6)
    valid = torch.arange(96) < 90  # the last 6 rows are padding
    local = [m.to_local(ids, valid) for m in maps]
    assert torch.equal((local[0] < 3) ^ (local[1] < 3), torch.ones_like(ids, dtype=torch.bool))
    assert maps[0].window[0].tolist() == [30, 90, 0] and maps[1].window[0].tolist() == [30, 0, 30]


def test_expert_parallel_arguments_refused_where_they_would_do_nothing(qwen3_dir, qwen3_moe_dir):
    """Each names the field: EP on a dense model, EPLB without EP, balancer settings without the balancer."""
    from raygrid.engine.arg_utils import EngineArgs

    cases = [
        (dict(model=qwen3_dir, enable_expert_parallel=True), r"enable_expert_parallel: model .* has no experts"),
        (dict(model=qwen3_moe_dir, enable_eplb=True), r"enable_eplb needs enable_expert_parallel"),
        (dict(model=qwen3_moe_dir, eplb_config={"num_redundant_experts": 2}), r"eplb_config.num_redundant_experts: needs enable_expert_parallel"),
        (dict(model=qwen3_moe_dir, enable_expert_parallel=True, eplb_config={"step_interval": 5}), r"eplb_config.step_interval: needs enable_eplb"),
        (dict(model=qwen3_moe_dir, enable_expert_parallel=True, eplb_config={"window_sizes": 5}), r"eplb_config.window_sizes: is not an argument raygrid knows"),
        (dict(model=qwen3_moe_dir, enable_expert_parallel=True, eplb_config={"num_redundant_experts": 3}, data_parallel_size=2),
         r"eplb_config.num_redundant_experts: num_experts \+ num_redundant_experts \(8 \+ 3\) is not divisible by the expert-parallel size \(DP x TP = 2\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            EngineArgs(device="cpu", **kwargs).create_engine_config()
