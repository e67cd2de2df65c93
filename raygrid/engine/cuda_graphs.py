"""CUDA graphs of the decode forward pass.

A decode step launches hundreds of small kernels; replaying a captured graph launches them all at
once. One graph is captured per padded batch size, reading its inputs from static buffers: a step
copies its inputs in (padding rows get slot -1 and sequence length 0, which the kernels skip) and
replays the graph of the smallest size that fits.

Under tensor parallelism the all-reduces are captured inside the graphs (every rank captures the same
sizes in the same order, and replays the same size, since all see the same SchedulerOutput). A pipeline
stage captures its own layers: a stage after the first reads the previous stage's hidden states and
residual from two more static buffers, and a stage before the last returns its own pair; the hand-off
between stages stays outside the graph.

Under expert parallelism the MoE layers' all-gather and reduce-scatter over the DP ranks are captured too:
the DP ranks agree before each pass whether all of them replay, and then replay the same size.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Callable, ContextManager

import torch

from raygrid.models.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_batch]
    sizes += list(range(16, max_batch + 1, 16))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


class DecodeGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], max_batch: int, max_blocks: int, device: torch.device,
                 sizes: list[int] | None = None, stage_input: tuple[int, torch.dtype] | None = None,
                 context: Callable[[int], ContextManager] | None = None) -> None:
        """``stage_input``: (hidden size, dtype) of the hidden states a later pipeline stage receives. ``context``:
        what each size's warm-up and capture run under (expert parallelism: the DP ranks' token counts)."""
        self.sizes = sizes or capture_sizes(max_batch)
        self.max_batch = max_batch
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.intermediate = None
        if stage_input is not None:
            hidden_size, dtype = stage_input
            self.intermediate = tuple(torch.zeros(max_batch, hidden_size, dtype=dtype, device=device) for _ in range(2))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory pool
            args = (self.input_ids[:size], self.positions[:size], kv_caches, self._metadata(size), self._stage_input(size))
            with context(size) if context is not None else nullcontext():
                for _ in range(2):  # compile and warm up (and, under TP, set up the communicators) outside the capture
                    model(*args)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[size] = model(*args)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def _stage_input(self, size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.intermediate is None else tuple(t[:size] for t in self.intermediate)

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            block_tables=self.block_tables[:size],
            seq_lens=[],
            query_start_loc=[],
            max_query_len=1,
            max_seq_len=0,
            seq_lens_tensor=self.seq_lens[:size],
            query_start_loc_tensor=self.query_start_loc[: size + 1],
        )

    def padded_size(self, num_reqs: int) -> int | None:
        return next((s for s in self.sizes if s >= num_reqs), None)

    def run(self, size: int, num_reqs: int, input_ids, positions, slot_mapping, block_tables, seq_lens, intermediate=None):
        """Replay the graph of ``size`` (>= num_reqs) on this step's decode inputs (and, after the first
        pipeline stage, the previous stage's hidden states); returns what the model returns, for num_reqs rows."""
        self.input_ids[:num_reqs].copy_(input_ids)
        self.positions[:num_reqs].copy_(positions)
        self.slot_mapping[:num_reqs].copy_(slot_mapping)
        self.slot_mapping[num_reqs:size].fill_(-1)
        self.seq_lens[:num_reqs].copy_(seq_lens)
        self.seq_lens[num_reqs:size].zero_()
        self.block_tables[:num_reqs, : block_tables.shape[1]].copy_(block_tables)
        if self.intermediate is not None:
            for static, given in zip(self.intermediate, intermediate):
                static[:num_reqs].copy_(given)
        self.graphs[size].replay()
        out = self.outputs[size]
        return tuple(t[:num_reqs] for t in out) if isinstance(out, tuple) else out[:num_reqs]
