"""Host-to-device transfers of a step's inputs that never wait for the device: pinned host buffers and their device
twin for the fields every step has, copied over in one transfer a group (``StagingBuffers``), and ``to_device`` for
the arrays of variable size some requests add (penalties' token ids, logit biases, bans, allowed tokens)."""

from __future__ import annotations

import numpy as np
import torch

ALIGN = 256  # bytes: every field starts aligned, as a tensor of its own would (kernels specialize on 16)


class StagingBuffers:
    """Host-to-device transfer of each step's inputs. Every field has a fixed place in one device buffer (the
    fields' device twins are views of it, so CUDA graphs read a step's inputs from them directly,
    engine/cuda_graphs.py) and the same place in a pinned host buffer. ``stage`` writes a group of fields
    into the host buffer and copies the span they cover in one transfer. Below long contexts a lone request's
    step waits for the host, whose time is mostly such fixed costs: one copy a group instead of one a field took
    a quarter off the host's time for a step's inputs on an H200's host (benchmarks/README.md, eleventh session).
    Fields staged together should be declared next to each other, the large ones last: the span runs from the
    first field's start to the last one's used end, unused capacity in between included.

    Two host buffers alternate by step: with async scheduling a step fills its inputs while the previous
    step's copy may still be queued. A buffer is written again only after the device has run everything
    queued while it was current: an event recorded when the step leaves it. Without that wait, steps that
    sample nothing (the chunks of a long prompt before its last) return at once, the host runs two or more
    steps ahead of the device, and a queued copy reads the buffer after a later step has overwritten it: a
    chunk then ran with another chunk's tokens, positions and slots (benchmarks/README.md, "A race in the
    staged inputs").

    The buffers start as zeros: a graph's padding rows read whatever an earlier step left there, always a
    valid token id and position. On the CPU the host buffer is the device buffer: nothing is copied."""

    def __init__(self, device: torch.device, specs: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.on_gpu = device.type == "cuda"
        self.offsets: dict[str, int] = {}
        end = 0
        for name, (shape, dtype) in specs.items():
            self.offsets[name] = end
            end += -(-int(np.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN
        self.specs = specs
        self.row_bytes = {name: int(np.prod(shape[1:])) * dtype.itemsize for name, (shape, dtype) in specs.items()}
        self.nbytes = end
        self.device_bytes = torch.zeros(end, dtype=torch.uint8, device=device)
        self.device = {name: self._field(self.device_bytes, name) for name in specs}
        sets = 2 if self.on_gpu else 1
        # Zeros too: a span copies the host's bytes of the fields between those staged, and of the rows past them,
        # which graphs read as padding, so they must hold valid ids and positions from the start.
        self.host_bytes = [torch.zeros(end, dtype=torch.uint8, pin_memory=True) for _ in range(sets)] if self.on_gpu else [self.device_bytes]
        self.hosts = [{name: self._field(buf, name).numpy() for name in specs} for buf in self.host_bytes]
        self._views: dict[str, tuple[int, torch.Tensor]] = {}  # per field: the last rows staged, and their view
        self.current = 0
        self.released: list[torch.cuda.Event | None] = [None] * sets  # per set: recorded when a step left it

    def _field(self, buffer: torch.Tensor, name: str) -> torch.Tensor:
        shape, dtype = self.specs[name]
        start = self.offsets[name]
        return buffer[start : start + int(np.prod(shape)) * dtype.itemsize].view(dtype).view(shape)

    def _rows(self, name: str, rows: int) -> torch.Tensor:
        """The device field's first ``rows`` rows; the view is kept while steps stage as many (a decode step's
        shape repeats, and making a view is a call into torch)."""
        kept = self._views.get(name)
        if kept is None or kept[0] != rows:
            kept = self._views[name] = (rows, self.device[name][:rows])
        return kept[1]

    def next_step(self) -> None:
        """Move to the other host buffer, once the copies out of it (queued two steps ago) are done."""
        if not self.on_gpu:
            return
        event = self.released[self.current] or torch.cuda.Event()
        event.record()
        self.released[self.current] = event
        self.current ^= 1
        if self.released[self.current] is not None:
            self.released[self.current].synchronize()

    def stage(self, **arrays: np.ndarray | None) -> dict[str, torch.Tensor]:
        """The arrays on the device, by field name, as views of the fields' first rows (``None`` is skipped):
        written into the host buffer, then copied in one transfer, queued on the current stream."""
        host = self.hosts[self.current]
        lo, hi, staged = self.nbytes, 0, {}
        for name, array in arrays.items():
            if array is None:
                continue
            rows = array.shape[0]
            host[name][(slice(0, rows),) + tuple(slice(0, s) for s in array.shape[1:])] = array
            start = self.offsets[name]
            lo = min(lo, start)
            hi = max(hi, start + rows * self.row_bytes[name])
            staged[name] = self._rows(name, rows)
        if self.on_gpu and hi > lo:
            self.device_bytes[lo:hi].copy_(self.host_bytes[self.current][lo:hi], non_blocking=True)
        return staged


def to_device(values, dtype: type | np.dtype, device: torch.device) -> torch.Tensor:
    """``values`` (an array or a list) as a tensor on ``device``, queued on the current stream through pinned memory.
    A copy from pageable memory (``torch.tensor(values, device=...)``) waits for everything queued before it: under
    async scheduling the host would stall until the step in flight finished, and stop running ahead of the GPU. The
    pinned block is not reused before the copy is done (torch records an event for it)."""
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=dtype))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """The way back: a device tensor copied into pinned host memory, queued on the current stream (valid once the
    stream gets there; an event recorded after the copy says when). A tensor already on the host is returned as is."""
    if not tensor.is_cuda:
        return tensor
    return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True).copy_(tensor, non_blocking=True)


def step_fields(max_tokens: int, max_reqs: int, max_blocks_per_req: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The fields a model runner stages each step, in the groups staged together (one copy each), the large fields of
    a group last: the model's inputs, then the sampling inputs, then the grammar rows. A request has at most one
    token whose id is still on the device (async scheduling), so the placeholders need a row each, not a token each."""
    return {
        "input_ids": ((max_tokens,), torch.int64),
        "positions": ((max_tokens,), torch.int64),
        "slot_mapping": ((max_tokens,), torch.int64),
        "logits_indices": ((max_reqs,), torch.int64),
        "placeholder_index": ((max_reqs,), torch.int64),
        "placeholder_source": ((max_reqs,), torch.int64),
        "seq_lens": ((max_reqs,), torch.int32),
        "decode_order": ((max_reqs,), torch.int32),
        "query_start_loc": ((max_reqs + 1,), torch.int32),
        "block_tables": ((max_reqs, max_blocks_per_req), torch.int32),
        "temperature": ((max_reqs,), torch.float32),
        "greedy": ((max_reqs,), torch.bool),
        "top_k": ((max_reqs,), torch.int64),
        "top_p": ((max_reqs,), torch.float32),
        "min_p": ((max_reqs,), torch.float32),
        "repetition_penalty": ((max_reqs,), torch.float32),
        "frequency_penalty": ((max_reqs,), torch.float32),
        "presence_penalty": ((max_reqs,), torch.float32),
        "penalty_slots": ((max_reqs,), torch.int64),
        "seeds": ((max_reqs,), torch.int64),
        "grammar_rows": ((max_reqs,), torch.int64),
        "grammar_mask_rows": ((max_reqs,), torch.int64),
    }
