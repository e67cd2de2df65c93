"""Process groups over real gloo groups in separate processes: the grid's TP and PP groups and every
collective the engine uses (all-reduce, all-gather, object broadcast, point-to-point, barrier)."""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp

from raygrid.parallel.groups import destroy_parallel_state, init_parallel_state
from raygrid.parallel.rank_grid import RankGrid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, results) -> None:
    torch.set_num_threads(1)
    grid = RankGrid(tp=2, pp=2)
    state = init_parallel_state(grid, rank, f"tcp://127.0.0.1:{port}", torch.device("cpu"), timeout_s=60)
    tp, pp = state.tp, state.pp
    out = {"tp_ranks": tp.ranks, "pp_ranks": pp.ranks}
    out["all_reduce"] = tp.all_reduce(torch.full((3,), float(rank + 1))).tolist()
    out["all_gather"] = tp.all_gather(torch.tensor([[rank, rank * 10]]), dim=-1).tolist()
    out["broadcast"] = tp.broadcast_object({"from": rank, "step": 7} if tp.is_first else None)
    if pp.is_first:  # stage 0 sends hidden states and residuals to stage 1
        pp.send([torch.full((2, 4), float(rank)), torch.full((2, 4), -float(rank))], dst=1)
    else:
        hidden, residual = pp.recv([(2, 4), (2, 4)], torch.float32, torch.device("cpu"), src=0)
        out["received"] = [hidden[0, 0].item(), residual[0, 0].item()]
    pp.barrier()
    results[rank] = out
    destroy_parallel_state()


def test_groups_and_collectives_on_four_ranks():
    world, port = 4, free_port()
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_rank_main, args=(world, port, results), nprocs=world, join=True)
    # TP=2 x PP=2: TP groups {0,1} {2,3} (one stage each), PP groups {0,2} {1,3}.
    assert [results[r]["tp_ranks"] for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [results[r]["pp_ranks"] for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert results[0]["all_reduce"] == results[1]["all_reduce"] == [3.0] * 3  # 1 + 2
    assert results[2]["all_reduce"] == [7.0] * 3  # 3 + 4
    assert results[3]["all_gather"] == [[2, 20, 3, 30]]
    assert results[1]["broadcast"] == {"from": 0, "step": 7} and results[3]["broadcast"] == {"from": 2, "step": 7}
    assert results[2]["received"] == [0.0, -0.0] and results[3]["received"] == [1.0, -1.0]
