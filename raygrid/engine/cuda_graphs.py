"""CUDA graphs of whole forward passes: decode steps, and steps with prefill whose requests bring few queries each.

A step launches hundreds of small kernels; replaying a captured graph launches them all at once. The graphs
read their inputs from static buffers, the tensors a step's inputs are staged in, and the step replays the graph
of the smallest size that fits. Two kinds share the buffers and one memory pool (``GraphBuffers``, with the piecewise graphs):

- **Decode** graphs, one per padded batch size: one token per request. Padding rows get slot -1 and
  sequence length 0, which the kernels skip.
- **Mixed** graphs, one per padded token count (the sizes of the piecewise graphs up to 2,048 tokens),
  each over ``max_batch`` sequences: decodes beside prompt chunks, the step that serving with many requests
  in flight runs nearly every time. The prefill attention kernel's grid depends on the token count and the
  number of sequences alone (kernels/triton_attention.py), so it is captured like any other kernel: padding
  sequences have no queries and length 0, and padding rows belong to no sequence and have slot -1. A step
  replays a mixed graph only when the graph's attention launch (tile shape) is the one the step would
  take eagerly: steps of long prompts, whose attention wants the large tiles, replay the piecewise graphs
  (engine/piecewise_graphs.py) instead. One graph launch then replaces some 30 piece launches and 28
  attention launches from Python.

Under tensor parallelism the all-reduces are captured inside the graphs (every rank captures the same
sizes in the same order, and replays the same size, since all see the same SchedulerOutput). A pipeline
stage captures its own layers: a stage after the first reads the previous stage's hidden states and
residual from two more static buffers, and a stage before the last returns its own pair; the hand-off
between stages stays outside the graph.

Under expert parallelism the MoE layers' all-gather and reduce-scatter over the DP ranks are captured in the
decode graphs: the DP ranks agree before each pass whether all of them replay, and then replay the same size.
There are no mixed graphs there (eager passes pad to every DP rank's token count).
"""

from __future__ import annotations

import functools
import logging
from contextlib import nullcontext
from typing import Callable, ContextManager, TypeVar

import torch

from raygrid.kernels import ops
from raygrid.kernels.variants import graph_rows
from raygrid.models.layers.attention import AttentionMetadata

logger = logging.getLogger(__name__)


def capture_sizes(max_batch: int) -> list[int]:
    """The decode batch sizes graphs are captured at: those the decode kernel's launches are shaped for
    (``variants.graph_rows``: 1, 2, 4, 8, then multiples of 16) below ``max_batch``, and ``max_batch``."""
    sizes = [1]
    while sizes[-1] < max_batch:
        sizes.append(min(graph_rows(sizes[-1] + 1), max_batch))
    return sizes


@functools.cache
def capture_stream(device_index: int) -> torch.cuda.Stream:
    """The side stream every capture on this device runs on, one per process. cuBLAS keeps a workspace for each
    stream it has run on until the process ends, so a fresh stream per capture would leave one behind with every
    engine started."""
    return torch.cuda.Stream(device_index)


T = TypeVar("T")


def capture(call: Callable[[], T], pool, device: torch.device) -> tuple[torch.cuda.CUDAGraph, T]:
    """``call`` run twice outside any capture (Triton compiles, cuBLAS and, under TP, the communicators set up),
    then captured on the device's capture stream into ``pool``; returns the graph and what the captured call
    returned (its tensors are the graph's outputs, rewritten by each replay)."""
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=capture_stream(device.index)):
        result = call()
    return graph, result


class GraphBuffers:
    """What every CUDA graph of a runner shares, since none is replayed while another runs: the static tensors
    a graph reads its inputs from and leaves its result in, and the memory pool the captures draw on.

    The inputs are the runner's staged device tensors (engine/staging.py), which a step fills anyway, so a replay
    copies nothing in: it only marks the padding (rows past the step's tokens get slot -1; sequences past the
    step's have length 0 and no queries). A later pipeline stage's hidden states arrive in tensors of their own
    and are copied to ``intermediate``.

    A capture copies the model's result into ``outputs`` inside the graph, so nothing a capture allocates
    outlives it and the pool holds the largest pass's working memory once, whatever the number of sizes
    (profiling captures the largest sizes alone, memory_profile.profile_cuda_graphs)."""

    def __init__(self, staged: dict[str, torch.Tensor], max_tokens: int, max_seqs: int,
                 stage_input: tuple[int, torch.dtype] | None = None) -> None:
        """``staged``: the runner's device tensors by name (input_ids, positions, slot_mapping, seq_lens,
        block_tables, query_start_loc, decode_order), at least ``max_tokens`` rows and ``max_seqs`` sequences long.
        ``stage_input``: (hidden size, dtype) of the hidden states and residual a later pipeline stage receives."""
        self.max_tokens = max_tokens
        self.input_ids = staged["input_ids"][:max_tokens]
        self.positions = staged["positions"][:max_tokens]
        self.slot_mapping = staged["slot_mapping"][:max_tokens]
        self.seq_lens = staged["seq_lens"][:max_seqs]
        self.block_tables = staged["block_tables"][:max_seqs]
        self.query_start_loc = staged["query_start_loc"][: max_seqs + 1]
        # A decode graph's padding sequences start after the step's, in their own order (the rows listed past the
        # step's are reset from ``_rows`` before each replay).
        self.decode_order = staged["decode_order"][:max_seqs]
        self._rows = torch.arange(max_seqs, dtype=self.decode_order.dtype, device=self.decode_order.device)
        self.decode_order.copy_(self._rows)
        # No sequence has queries and none is long until a step says so: a capture of T tokens over max_seqs
        # sequences must not address rows past T (the decode kernel does not read these).
        self.seq_lens.zero_()
        self.query_start_loc.zero_()
        self.slot_mapping.fill_(-1)
        self.intermediate = None
        if stage_input is not None:
            hidden_size, dtype = stage_input
            self.intermediate = tuple(torch.zeros(max_tokens, hidden_size, dtype=dtype, device=self.input_ids.device) for _ in range(2))
        self.outputs: tuple[torch.Tensor, ...] | None = None  # allocated by the first warm-up, outside any capture
        self.pool = torch.cuda.graph_pool_handle() if self.input_ids.is_cuda else None

    def model_args(self, num_tokens: int, kv_caches, meta: AttentionMetadata | None) -> tuple:
        stage_input = None if self.intermediate is None else tuple(t[:num_tokens] for t in self.intermediate)
        return self.input_ids[:num_tokens], self.positions[:num_tokens], kv_caches, meta, stage_input

    def metadata(self, num_tokens: int, num_seqs: int, max_query_len: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:num_tokens],
            block_tables=self.block_tables[:num_seqs],
            seq_lens=[],
            query_start_loc=[],
            max_query_len=max_query_len,
            seq_lens_tensor=self.seq_lens[:num_seqs],
            query_start_loc_tensor=self.query_start_loc[: num_seqs + 1],
            decode_order=self.decode_order[:num_seqs],
        )

    def prepare(self, padded: int, input_ids, positions, meta: AttentionMetadata, intermediate, num_seqs: int = 0,
                queries: bool = False) -> int:
        """Ready the buffers for a graph of ``padded`` tokens, the step's inputs being staged in them already: its
        padding rows; with ``num_seqs``, a graph over that many sequences, its padding sequences; with ``queries``,
        their query rows too (decode graphs do not read them). Returns the step's tokens."""
        n = input_ids.shape[0]
        staged = (input_ids, self.input_ids), (positions, self.positions), (meta.slot_mapping, self.slot_mapping)
        if n and any(given.data_ptr() != static.data_ptr() for given, static in staged):
            raise ValueError("a CUDA graph replays the staged inputs (StagingBuffers.stage), not other tensors")
        # Each write below is skipped where it has no rows: at small batches a step's host time is mostly such calls.
        if padded > n:
            self.slot_mapping[n:padded].fill_(-1)
        if self.intermediate is not None:
            for static, given in zip(self.intermediate, intermediate):
                static[:n].copy_(given)
        b = meta.seq_lens_tensor.shape[0]
        if num_seqs > b:
            self.seq_lens[b:num_seqs].zero_()
            self.decode_order[b:num_seqs].copy_(self._rows[b:num_seqs])
            if queries:
                self.query_start_loc[b + 1 : num_seqs + 1].fill_(n)
        return n

    def keep(self, result) -> None:
        """Copy a pass's result (hidden states; and the residual before the last pipeline stage) to ``outputs``."""
        result = result if isinstance(result, tuple) else (result,)
        if self.outputs is None:
            self.outputs = tuple(torch.empty(self.max_tokens, *t.shape[1:], dtype=t.dtype, device=t.device) for t in result)
        for static, t in zip(self.outputs, result):
            static[: t.shape[0]].copy_(t)

    def result(self, n: int):
        """The last replay's result, for the step's ``n`` rows (valid until the next replay)."""
        rows = tuple(t[:n] for t in self.outputs)
        return rows if len(rows) > 1 else rows[0]


class FullGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], buffers: GraphBuffers, max_batch: int,
                 sizes: list[int] | None = None, context: Callable[[int], ContextManager] | None = None,
                 mixed_sizes: list[int] = ()) -> None:
        """``sizes``: the decode batch sizes (default: ``capture_sizes``); ``mixed_sizes``: the token counts of
        the mixed graphs, each over ``max_batch`` sequences. ``context``: what each decode size's warm-up and
        capture run under (expert parallelism: the DP ranks' token counts)."""
        self.buffers = buffers
        self.sizes = sizes or capture_sizes(max_batch)
        self.mixed_sizes = sorted(mixed_sizes)
        self.max_batch = max_batch
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.mixed_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.num_mixed_replays = 0
        # The attention launch each mixed graph captured (a step replays it only if it would launch the same).
        self._mixed_launch = {size: ops.prefill_launch(size, max_batch) for size in self.mixed_sizes}
        for size in reversed(self.mixed_sizes):  # largest first: the smaller ones fit in the pool it leaves
            meta = buffers.metadata(size, max_batch, max_query_len=size)
            self.mixed_graphs[size] = self._capture(model, kv_caches, size, meta, nullcontext())
        for size in reversed(self.sizes):
            meta = buffers.metadata(size, size, max_query_len=1)
            self.graphs[size] = self._capture(model, kv_caches, size, meta, context(size) if context else nullcontext())
        torch.cuda.synchronize()
        logger.info("captured CUDA graphs: decode batch sizes %s, mixed token counts %s", self.sizes, self.mixed_sizes)

    def _capture(self, model, kv_caches, num_tokens: int, meta: AttentionMetadata, context: ContextManager) -> torch.cuda.CUDAGraph:
        args = self.buffers.model_args(num_tokens, kv_caches, meta)
        with context:
            graph, _ = capture(lambda: self.buffers.keep(model(*args)), self.buffers.pool, self.buffers.input_ids.device)
        return graph

    def padded_size(self, num_reqs: int) -> int | None:
        """The decode graph for ``num_reqs`` rows."""
        return next((s for s in self.sizes if s >= num_reqs), None)

    def mixed_size(self, num_tokens: int, num_reqs: int) -> int | None:
        """The mixed graph for a step with prefill, if one fits it and captured the launch it would take."""
        if num_reqs > self.max_batch:
            return None
        size = next((s for s in self.mixed_sizes if s >= num_tokens), None)
        if size is None or self._mixed_launch[size] is not ops.prefill_launch(num_tokens, num_reqs):
            return None
        return size

    def run(self, size: int, input_ids, positions, meta: AttentionMetadata, intermediate=None):
        """Replay the decode graph of ``size`` (>= the step's rows, one token each) on this step's inputs (and,
        after the first pipeline stage, the previous stage's hidden states); returns what the model returns, for
        the step's rows."""
        n = self.buffers.prepare(size, input_ids, positions, meta, intermediate, num_seqs=size)
        self.graphs[size].replay()
        return self.buffers.result(n)

    def run_mixed(self, size: int, input_ids, positions, meta: AttentionMetadata, intermediate=None):
        """Replay the mixed graph of ``size`` (>= the step's tokens) on this step's inputs and attention metadata."""
        n = self.buffers.prepare(size, input_ids, positions, meta, intermediate, num_seqs=self.max_batch, queries=True)
        self.num_mixed_replays += 1
        self.mixed_graphs[size].replay()
        return self.buffers.result(n)


class CallGraph:
    """A CUDA graph of one call whose tensors keep their addresses from call to call, replayed in place of the call.
    The one-launch decode pass (kernels/persistent_decode.py) is such a call: its inputs are a one-token step's staged
    fields and everything else it touches is its own scratch. Launched from Python, Triton binds its 25 arguments at
    every step, which cost a lone request's step more host time than the pass saved on the GPU at short contexts
    (benchmarks/README.md, eleventh session)."""

    def __init__(self, call: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...], pool=None) -> None:
        self.inputs = inputs
        self.graph, self.output = capture(lambda: call(*inputs), pool, inputs[0].device)
        torch.cuda.synchronize()

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        """Replay on ``inputs``, which must be the captured tensors (a step's staged fields): returns the captured
        output tensor, valid until the next replay."""
        if any(given.data_ptr() != static.data_ptr() or given.shape != static.shape for given, static in zip(inputs, self.inputs)):
            raise ValueError("a CUDA graph replays the tensors it captured (StagingBuffers.stage), not other tensors")
        self.graph.replay()
        return self.output

