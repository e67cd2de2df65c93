"""Pinned host buffers and their device twins for each step's inputs."""

from __future__ import annotations

import numpy as np
import torch


class StagingBuffers:
    """Host-to-device transfer of each step's inputs through pinned buffers and their device twins,
    allocated once. Two sets of host buffers alternate by step: with async scheduling a step fills
    its inputs while the previous step's copies may still be queued. On CPU the arrays are used in place.

    A set is written again only after the device has run everything queued while it was current: an event
    recorded when the step leaves it. Without that wait, steps that sample nothing (the chunks of a long prompt
    before its last) return at once, the host runs two or more steps ahead of the device, and a queued copy
    reads the buffers after a later step has overwritten them: a chunk then ran with another chunk's tokens,
    positions and slots (benchmarks/README.md, "A race in the staged inputs").

    The device twins never move, so CUDA graphs read a step's inputs from them directly (engine/cuda_graphs.py).
    They start as zeros: a graph's padding rows read whatever an earlier step left there, always a valid token
    id and position."""

    def __init__(self, device: torch.device, specs: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.on_gpu = device.type == "cuda"
        self.dtypes = {name: dtype for name, (_, dtype) in specs.items()}
        self.hosts: list[dict[str, torch.Tensor]] = [{}, {}]
        self.device: dict[str, torch.Tensor] = {}
        self.current = 0
        self.released: list[torch.cuda.Event | None] = [None, None]  # per set: recorded when a step left it
        if self.on_gpu:
            for name, (shape, dtype) in specs.items():
                for host in self.hosts:
                    host[name] = torch.empty(shape, dtype=dtype, pin_memory=True)
                self.device[name] = torch.zeros(shape, dtype=dtype, device=device)

    def next_step(self) -> None:
        """Move to the other set of host buffers, once the copies out of it (queued two steps ago) are done."""
        if self.on_gpu:
            event = self.released[self.current] or torch.cuda.Event()
            event.record()
            self.released[self.current] = event
        self.current ^= 1
        if self.on_gpu and self.released[self.current] is not None:
            self.released[self.current].synchronize()

    def put(self, name: str, array: np.ndarray) -> torch.Tensor:
        """The array on the device (asynchronous copy; the step's one sync comes later)."""
        dtype = self.dtypes[name]
        if not self.on_gpu:
            return torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
        rows = array.shape[0]
        host = self.hosts[self.current][name][:rows]
        host.numpy()[(slice(None),) + tuple(slice(0, s) for s in array.shape[1:])] = array
        device = self.device[name][:rows]
        device.copy_(host, non_blocking=True)
        return device
