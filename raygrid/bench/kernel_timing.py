"""Timing a kernel inside a CUDA graph, for the kernel sweeps in benchmarks/scripts."""

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
