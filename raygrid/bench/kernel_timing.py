"""Timing kernels inside CUDA graphs, for the kernel sweeps in benchmarks/scripts."""

from __future__ import annotations

from collections.abc import Callable


def cuda_graph_ms(fn: Callable[[], object], rep: int = 20) -> float:
    """Milliseconds a call of ``fn`` takes when replayed from a CUDA graph (Triton's ``do_bench_cudagraph``, so launch
    overhead is left out), after everything already queued has finished.

    ``do_bench_cudagraph`` runs ``fn`` on a side stream of its own, which does not wait for the current stream: inputs
    a script has just made there (random caches, block tables) may not be written yet when its first call reads them.
    A block table read before it is written holds whatever the allocator's memory held, and the kernel then
    addresses pages that do not exist."""
    import torch
    from triton.testing import do_bench_cudagraph

    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=rep)


def chain_us(calls, replays: int = 20) -> float:
    """Microseconds per call of ``calls`` (each a zero-argument function), captured in order in one CUDA graph and
    replayed (the best of 3 rounds of ``replays``). Calls over different weights each read theirs from memory, as a
    step's layers do, where ``cuda_graph_ms`` repeating one call would find its weight in L2."""
    import torch

    for call in calls:  # compile, allocate
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays / len(calls))
    del graph
    return min(times)
