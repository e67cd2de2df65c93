"""The custom all-reduce on a GPU: the gate for its flag protocol and memory ordering.

- One GPU, a CUDA stream per rank: the ranks' kernels run at the same time on one device, over plain device
  buffers, for thousands of back-to-back calls at every size and dtype, eager and replayed from CUDA graphs.
  Every result must be bitwise the reference's on every rank.
- Processes: the communicator itself (torch symmetric memory, the rendezvous, the NVLink check) with one
  process a rank and a GPU each (symmetric memory refuses two ranks on one device).
Skipped without CUDA; tests/test_custom_all_reduce.py runs the same kernels on CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from raygrid.kernels.allreduce_ref import all_reduce_ref
from raygrid.kernels.triton_allreduce import header_bytes, launch_all_reduce
from tests.test_groups import free_port

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run on the device machine")

MAX_BYTES = 8 * 2**20
SIZES = [4 * 2**10, 8 * 2**10, 64 * 2**10, 256 * 2**10, 2**20, 4 * 2**20, MAX_BYTES]  # bytes
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


class StreamRanks:
    """``world`` ranks in this process: one buffer and one stream each, the peers' buffers reached directly."""

    def __init__(self, world: int, num_blocks: int = 32) -> None:
        self.world, self.num_blocks = world, num_blocks
        self.header = header_bytes(world)
        self.buffers = [torch.zeros(self.header + 2 * MAX_BYTES, dtype=torch.uint8, device="cuda") for _ in range(world)]
        self.ptrs = torch.tensor([b.data_ptr() for b in self.buffers], dtype=torch.int64, device="cuda")
        self.streams = [torch.cuda.Stream() for _ in range(world)]
        # Load every kernel this test runs before any spins: loading one while another rank's kernel waits in
        # this same process can wait for the device to go idle.
        for dtype in DTYPES:
            x = torch.empty(16, dtype=dtype, device="cuda")
            for two_shot in (False, True):
                for rank in range(world):
                    launch_all_reduce(two_shot, x, x, self.ptrs, 1, self.header, rank, world, num_blocks, compile_only=True)
        torch.cuda.synchronize()

    def launch(self, inputs, outputs, two_shot: bool) -> None:
        """Every rank's call on its own stream; they meet at the flags."""
        for rank, stream in enumerate(self.streams):
            with torch.cuda.stream(stream):
                launch_all_reduce(two_shot, inputs[rank], outputs[rank], self.ptrs, MAX_BYTES // inputs[rank].element_size(),
                                  self.header, rank, self.world, self.num_blocks)

    def sync(self) -> None:
        for stream in self.streams:
            stream.synchronize()


def _check(outputs, inputs, what) -> None:
    want = all_reduce_ref(inputs)
    for rank, out in enumerate(outputs):
        assert torch.equal(out, want), f"{what}, rank {rank}: off by {(out.float() - want.float()).abs().max().item()}"


@pytest.mark.parametrize("world", [2, 4])
def test_kernels_with_a_stream_per_rank_back_to_back_eager_and_in_graphs(world):
    ranks = StreamRanks(world)
    g = torch.Generator(device="cuda").manual_seed(world)
    calls = 0
    # Eager: every size, dtype and kernel, several rounds back to back before looking at the results, so that
    # a call starts while the last is still being read. Odd lengths leave ragged slices and blocks.
    for dtype in DTYPES:
        for nbytes in SIZES:
            numel = nbytes // (torch.finfo(dtype).bits // 8) - 3
            for two_shot in (False, True):
                rounds = []
                for _ in range(4):
                    inputs = [torch.randn(numel, generator=g, device="cuda").to(dtype) for _ in range(world)]
                    torch.cuda.synchronize()
                    outputs = [torch.empty_like(x) for x in inputs]
                    ranks.launch(inputs, outputs, two_shot)
                    rounds.append((inputs, outputs))
                    calls += 1
                ranks.sync()
                for inputs, outputs in rounds:
                    _check(outputs, inputs, f"eager {dtype} {numel} two_shot={two_shot}")
    # Small messages, thousands of calls: flag reuse and the alternating halves under pressure.
    inputs = [[torch.randn(1000 + i, generator=g, device="cuda").to(torch.bfloat16) for _ in range(world)] for i in range(8)]
    outputs = [[torch.empty_like(x) for x in row] for row in inputs]
    torch.cuda.synchronize()
    for call in range(2000):
        ranks.launch(inputs[call % 8], outputs[call % 8], two_shot=call % 3 == 0)
        calls += 1
    ranks.sync()
    for row_in, row_out in zip(inputs, outputs):
        _check(row_out, row_in, "2,000 small calls")
    # CUDA graphs: each rank captures 40 calls on its stream (a ragged mix of sizes and both kernels); the
    # graphs replay side by side, 50 times.
    mix = [(4096 * (1 + i % 5) - i, i % 2 == 1) for i in range(40)]
    ins = [[torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) for _ in range(world)] for n, _ in mix]
    outs = [[torch.empty_like(x) for x in row] for row in ins]
    for (_, two_shot), row_in, row_out in zip(mix, ins, outs):  # compile outside the capture
        ranks.launch(row_in, row_out, two_shot)
    ranks.sync()
    graphs = []
    for rank, stream in enumerate(ranks.streams):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for (_, two_shot), row_in, row_out in zip(mix, ins, outs):
                launch_all_reduce(two_shot, row_in[rank], row_out[rank], ranks.ptrs, MAX_BYTES // 2, ranks.header, rank, world,
                                  ranks.num_blocks)
        graphs.append(graph)
    for replay in range(50):
        for row_out in outs:
            for out in row_out:
                out.zero_()
        torch.cuda.synchronize()
        for graph, stream in zip(graphs, ranks.streams):
            with torch.cuda.stream(stream):
                graph.replay()
        ranks.sync()
        for row_in, row_out in zip(ins, outs):
            _check(row_out, row_in, f"graph replay {replay}")
    calls += 50 * len(mix)
    assert calls > 4000


def _process_main(rank: int, world: int, port: int, results) -> None:
    from raygrid.parallel.groups import destroy_parallel_state, init_parallel_state
    from raygrid.parallel.rank_grid import RankGrid

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    # gloo groups: the communicator's handshake goes over the CPU group in any case.
    state = init_parallel_state(RankGrid(tp=world), rank, f"tcp://127.0.0.1:{port}", torch.device("cpu"), timeout_s=120)
    from raygrid.parallel.custom_all_reduce import CustomAllReduce

    comm = CustomAllReduce(state.tp, device)
    out = {"enabled": comm.enabled, "reason": comm.reason, "mismatches": []}
    if comm.enabled:
        for call in range(200):
            numel = [3000, 70_000, 600_000][call % 3]
            g = torch.Generator(device=device).manual_seed(call)
            inputs = [torch.randn(numel, generator=g, device=device).to(torch.bfloat16) for _ in range(world)]
            got = comm.all_reduce(inputs[rank])
            if not torch.equal(got, all_reduce_ref(inputs)):
                out["mismatches"].append(call)
        torch.cuda.synchronize()
    comm.close()
    results[rank] = out
    destroy_parallel_state()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="torch's symmetric memory wants a GPU a rank")
def test_communicator_over_symmetric_memory_in_one_process_a_rank():
    world = 2
    results = mp.Manager().dict()
    mp.spawn(_process_main, args=(world, free_port(), results), nprocs=world, join=True)
    for rank in range(world):
        assert results[rank]["enabled"], results[rank]["reason"]
        assert results[rank]["mismatches"] == [], results[rank]["mismatches"]
