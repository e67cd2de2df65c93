"""CUDA graphs of the decode forward pass.

A decode step launches hundreds of small kernels; replaying a captured graph launches them all at
once. One graph is captured per padded batch size, reading its inputs from static buffers: a step
copies its inputs in (padding rows get slot -1 and sequence length 0, which the kernels skip) and
replays the graph of the smallest size that fits.
"""

from __future__ import annotations

import logging

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
                 sizes: list[int] | None = None) -> None:
        self.sizes = sizes or capture_sizes(max_batch)
        self.max_batch = max_batch
        self.input_ids = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, max_blocks, dtype=torch.int32, device=device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for size in reversed(self.sizes):  # largest first, so the smaller ones reuse its memory pool
            meta = self._metadata(size)
            for _ in range(2):  # compile and warm up outside the capture
                model(self.input_ids[:size], self.positions[:size], kv_caches, meta)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = model(self.input_ids[:size], self.positions[:size], kv_caches, meta)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

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

    def run(self, size: int, num_reqs: int, input_ids, positions, slot_mapping, block_tables, seq_lens) -> torch.Tensor:
        """Replay the graph of ``size`` (>= num_reqs) on this step's decode inputs; returns the hidden states."""
        self.input_ids[:num_reqs].copy_(input_ids)
        self.positions[:num_reqs].copy_(positions)
        self.slot_mapping[:num_reqs].copy_(slot_mapping)
        self.slot_mapping[num_reqs:size].fill_(-1)
        self.seq_lens[:num_reqs].copy_(seq_lens)
        self.seq_lens[num_reqs:size].zero_()
        self.block_tables[:num_reqs, : block_tables.shape[1]].copy_(block_tables)
        self.graphs[size].replay()
        return self.outputs[size][:num_reqs]
