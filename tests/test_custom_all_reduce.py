"""The custom all-reduce (parallel/custom_all_reduce.py, kernels/triton_allreduce.py) on 2 and 4 CPU processes:
real gloo groups, buffers shared through /dev/shm, the kernels under Triton's interpreter. Every result must be
bitwise the reference's (ranks summed in rank order in float32, rounded once) on every rank, back to back over
both kernels, both buffer halves and the NCCL (here gloo) fallbacks. The GPU gate is in tests/test_gpu.py."""

from __future__ import annotations

import glob

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raygrid.kernels.allreduce_ref import all_reduce_ref
from raygrid.parallel.custom_all_reduce import CustomAllReduce, CustomAllReduceLimits, _local_verdict
from raygrid.parallel.groups import destroy_parallel_state, init_parallel_state
from raygrid.parallel.rank_grid import RankGrid
from tests.test_groups import free_port

LIMITS = CustomAllReduceLimits(max_bytes=32 * 1024, one_shot_max_bytes=4 * 1024, num_blocks=3)
# (elements, dtype, kernel: None = by size, False = one-shot, True = two-shot). 8,200 float32 elements are over
# max_bytes (gloo); int64 is not a supported dtype (gloo). Odd lengths leave ragged slices for the two-shot kernel.
CASES = [(1, torch.float32, None), (1000, torch.bfloat16, None), (3001, torch.float16, None), (5, torch.float32, True),
         (4099, torch.bfloat16, False), (7, torch.int64, None), (8200, torch.float32, None), (8191, torch.float32, None)]


def _inputs(case: int, world: int, numel: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(case)
    if dtype == torch.int64:
        return [torch.randint(-1000, 1000, (numel,), generator=g) for _ in range(world)]
    return [(torch.randn(numel, generator=g) * 4).to(dtype) for _ in range(world)]


def _rank_main(rank: int, world: int, port: int, results) -> None:
    torch.set_num_threads(1)
    state = init_parallel_state(RankGrid(tp=world), rank, f"tcp://127.0.0.1:{port}", torch.device("cpu"), timeout_s=120,
                                custom_all_reduce=True)
    tp = state.tp
    out = {"enabled": tp.custom.enabled, "reason": tp.custom.reason, "mismatches": [], "paths": []}
    # The engine's own communicator (default limits) through the group's entry point, then one with small limits
    # so that every path is taken: two rounds over the cases run both buffer halves on every block.
    wired = tp.all_reduce(_inputs(99, world, 64, torch.bfloat16)[rank])
    if not torch.equal(wired, all_reduce_ref(_inputs(99, world, 64, torch.bfloat16))):
        out["mismatches"].append("default communicator")
    tp.custom.close()
    tp.custom = CustomAllReduce(tp, torch.device("cpu"), LIMITS)
    for round_ in range(2):
        for case, (numel, dtype, two_shot) in enumerate(CASES):
            inputs = _inputs(case + 10 * round_, world, numel, dtype)
            mine = inputs[rank].clone()
            kernels = two_shot is not None or tp.custom.can_reduce(mine)
            if two_shot is None:
                out["paths"].append(kernels)
                got = tp.all_reduce(mine)
            else:
                got = tp.custom.all_reduce(mine, two_shot=two_shot)
            theirs = inputs[rank].clone()
            dist.all_reduce(theirs, group=tp.device_group)
            want = all_reduce_ref(inputs) if kernels else theirs  # the fallback is gloo's own sum
            if not torch.equal(got, want):
                out["mismatches"].append((round_, case, (got.double() - want.double()).abs().max().item()))
            if dtype == torch.float32:  # and the kernels' sum is gloo's up to the order of the terms
                torch.testing.assert_close(got, theirs, rtol=1e-6, atol=1e-5)
    # One program a call: a rank that finishes first starts the next call on the very elements a slower peer may
    # still be reading; the alternating halves keep them apart.
    tp.custom.close()
    tp.custom = CustomAllReduce(tp, torch.device("cpu"), CustomAllReduceLimits(max_bytes=32 * 1024, num_blocks=1))
    for call in range(12):
        inputs = _inputs(100 + call, world, 6000, torch.float32)
        if not torch.equal(tp.all_reduce(inputs[rank].clone()), all_reduce_ref(inputs)):
            out["mismatches"].append(("one program", call))
    results[rank] = out
    destroy_parallel_state()


@pytest.mark.parametrize("world", [2, 4])
def test_custom_all_reduce_matches_its_reference_on_every_rank(world):
    before = set(glob.glob("/dev/shm/raygrid-allreduce-*"))
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(world, free_port(), results), nprocs=world, join=True)
    for rank in range(world):
        assert results[rank]["enabled"], results[rank]["reason"]
        assert results[rank]["mismatches"] == [], (rank, results[rank]["mismatches"])
    # The size and dtype rules sent the same cases to the kernels on every rank: the float32 message over max_bytes
    # and the int64 one to gloo, the rest to the kernels.
    expected = [True, True, True, False, False, True] * 2
    assert all(results[r]["paths"] == expected for r in range(world)), [results[r]["paths"] for r in range(world)]
    assert set(glob.glob("/dev/shm/raygrid-allreduce-*")) == before  # the buffers' files are gone


def test_custom_all_reduce_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="num_blocks is 65; it must be between 1 and 64"):
        CustomAllReduce(None, torch.device("cpu"), CustomAllReduceLimits(num_blocks=65))
    assert _local_verdict(torch.device("cpu"), 9)[1] == "9 ranks; the kernels take at most 8"
