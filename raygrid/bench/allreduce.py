"""``raygrid bench allreduce``: the custom all-reduce against NCCL and torch's symmetric-memory kernels.

One process a GPU (torch.multiprocessing), one NCCL world. For every message size, in one run:
- correctness: both custom kernels against ``torch.distributed.all_reduce`` (within the dtype's tolerance: NCCL
  sums in another order) and bitwise against the reference (every rank's input gathered and summed in rank
  order), on every rank;
- time per call, eager (back-to-back launches) and inside a CUDA graph (many calls captured, replayed), of NCCL,
  the custom one-shot and two-shot kernels, and torch's symmetric-memory one-shot and two-shot all-reduce
  (torch's kernels read their input from its symmetric buffer, so they are timed without a copy in; ours
  include theirs).
The JSON carries the machine, date, commit and command; rank 0 reports, each time being the slowest rank's.
"""

from __future__ import annotations

import argparse
import json
import os

DEFAULT_SIZES = [2**k for k in range(12, 27)]  # 4 KiB to 64 MiB


def add_allreduce_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--world-size", type=int, default=None, help="GPUs (default: every visible one)")
    parser.add_argument("--sizes", type=int, nargs="+", default=DEFAULT_SIZES, help="message sizes in bytes")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--num-blocks", type=int, default=32, help="programs per custom call")
    parser.add_argument("--calls-per-graph", type=int, default=20)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--output-json", default=None)


def run_allreduce_benchmark(args: argparse.Namespace) -> dict:
    import torch  # here, not at the top: the CLI builds its parser from this module without torch
    import torch.multiprocessing as mp

    from raygrid.bench.throughput import provenance

    visible = torch.cuda.device_count()
    world = args.world_size or visible
    if not 2 <= world <= visible:
        raise ValueError(f"--world-size: must be between 2 and the {visible} visible GPUs (got {world})")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # no NVLS, no multimem (KINDS.md)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    port = _free_port()
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(world, port, vars(args), results), nprocs=world, join=True)
    report = {**provenance("raygrid"), "world_size": world, "dtype": args.dtype, "num_blocks": args.num_blocks,
              "rows": results[0]}
    for row in report["rows"]:
        print(" ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(report, f, indent=1)
    return report


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, args: dict, results) -> None:
    import torch
    import torch.distributed as dist

    from raygrid.kernels.allreduce_ref import all_reduce_ref
    from raygrid.parallel.custom_all_reduce import CustomAllReduce, CustomAllReduceLimits
    from raygrid.parallel.groups import destroy_parallel_state, init_parallel_state
    from raygrid.parallel.rank_grid import RankGrid

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dtype = getattr(torch, args["dtype"])
    sizes = sorted(args["sizes"])
    state = init_parallel_state(RankGrid(tp=world), rank, f"tcp://127.0.0.1:{port}", device)
    group = state.tp
    comm = CustomAllReduce(group, device, CustomAllReduceLimits(max_bytes=sizes[-1], num_blocks=args["num_blocks"]))
    if not comm.enabled:
        raise RuntimeError(f"custom all-reduce is off: {comm.reason}")
    torch_kernels = _torch_symm_mem(group, device, sizes[-1], dtype)
    rows = []
    for nbytes in sizes:
        numel = nbytes // dtype.itemsize
        g = torch.Generator(device=device).manual_seed(nbytes)
        inputs = [torch.randn(numel, generator=g, device=device).to(dtype) for _ in range(world)]  # every rank's
        x = inputs[rank]
        nccl = x.clone()
        dist.all_reduce(nccl, group=group.device_group)
        ref = all_reduce_ref(inputs)
        row = {"bytes": nbytes}
        scratch = x.clone()  # NCCL sums in place: time it on a copy
        calls = {"nccl": lambda: dist.all_reduce(scratch, group=group.device_group)}
        for name, two_shot in (("one_shot", False), ("two_shot", True)):
            got = comm.all_reduce(x, two_shot=two_shot)
            row[f"{name}_bitwise_ref"] = _everywhere(group, torch.equal(got, ref))
            row[f"{name}_max_err_vs_nccl"] = (got.float() - nccl.float()).abs().max().item()
            calls[name] = (lambda t: lambda: comm.all_reduce(x, two_shot=t))(two_shot)
        for name, fn in torch_kernels(x).items():
            calls[name] = fn
        for name, fn in calls.items():
            try:
                row[f"{name}_eager_us"] = _slowest(group, _time_eager(fn, group))
                row[f"{name}_graph_us"] = _slowest(group, _time_graph(fn, group, args["calls_per_graph"], args["replays"]))
            except Exception as error:  # torch's kernels have their own size and dtype limits: say which, go on
                row[f"{name}_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                torch.cuda.synchronize()
        rows.append(row)
    if rank == 0:
        results[0] = rows
    comm.close()
    destroy_parallel_state()


def _torch_symm_mem(group, device, max_bytes: int, dtype):
    """torch's symmetric-memory one-shot and two-shot all-reduce over one symmetric buffer (empty if missing)."""
    import torch

    try:
        from torch.distributed import _symmetric_memory as symm_mem

        buffer = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
        symm_mem.rendezvous(buffer, group.device_group)
        name = group.device_group.group_name
    except Exception:
        return lambda x: {}

    def kernels(x):
        view = buffer[: x.numel()]
        view.copy_(x)
        return {"torch_one_shot": lambda: torch.ops.symm_mem.one_shot_all_reduce(view, "sum", name),
                "torch_two_shot": lambda: torch.ops.symm_mem.two_shot_all_reduce_(view, "sum", name)}

    return kernels


def _time_eager(fn, group, iters: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    group.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _time_graph(fn, group, calls: int, replays: int) -> float:
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    group.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (calls * replays)


def _everywhere(group, ok: bool) -> bool:
    return all(group.all_gather_object(bool(ok)))


def _slowest(group, value: float) -> float:
    return max(group.all_gather_object(value))
