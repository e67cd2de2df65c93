"""Piecewise CUDA graphs of the forward pass of a step with prefill.

A decode step replays one graph of the whole pass (engine/cuda_graphs.py). A step with prefill cannot: its
attention's shape (query lengths, contexts, how many requests) changes every step. Run eagerly, its several
hundred Triton and cuBLAS launches cost more host time than a step of a few thousand tokens takes on the GPU
(about 13 ms for a 28-layer model on an H200). So the pass is captured in pieces, cut at each layer's
attention: the pieces (embedding, norms, projections, rotary, MLP, the all-reduces) replay as graphs at a
padded token count, and between them attention runs eagerly on the step's real tokens with the step's
metadata. This is vLLM's piecewise mode, cut by a hook in ``Attention.forward`` instead of a compiler.

Capturing a size: while the model runs on the static inputs, each ``Attention.forward`` calls the capture's
cut (``attention_cut``). It records, into the piece being captured, the layer's keys and values written to the cache (at the static
slots: padding rows have slot -1, which the store skips) and its queries copied to a static buffer; then it
ends that piece, starts the next, and returns the attention output buffer for the rest of the layer to read.
Replaying (the step's inputs are staged in the static buffers already): piece 0, layer 0's attention, piece 1,
... and the last piece, which copies the pass's result to a static buffer too. Every layer shares the query and
output buffers: one layer's attention runs after the piece that fills them and before the piece that reads the
output, all on one stream.
Padding rows run through the pieces (their operations work row by row) but never through attention.

Every size shares the static inputs, the outputs and one memory pool with the full graphs (``GraphBuffers``,
engine/cuda_graphs.py), captured largest first. Nothing a capture allocates outlives it (what crosses from one
piece to the next is freed in the piece that reads it), so the pool holds the largest pass's working memory
once, and the graphs, never replayed together, take turns in it.

The full graphs' mixed kind replays most steps with prefill in one launch; the pieces take the steps whose
attention wants the prompt tiles (long prompts, few requests), whose launches the graphs did not capture.
"""

from __future__ import annotations

import logging

import torch

from raygrid.engine.cuda_graphs import GraphBuffers, capture_stream
from raygrid.models.layers.attention import Attention, AttentionMetadata, attention_cut

logger = logging.getLogger(__name__)

# The largest pass captured. Larger prefills run eagerly: their GPU time outgrows the host's launches, which do not
# grow with the tokens (about 19 ms of host time a pass for Qwen3-0.6B on the H200 machine's host, against 22 ms of
# GPU time at 8,192 tokens: W1's prompt steps waited for the host with a cap of 2,048; benchmarks/README.md).
MAX_TOKENS = 8192
FINE_UP_TO = 2048  # sizes every 256 tokens up to here, every 512 beyond: at most 511 padding rows on a long step


def piecewise_sizes(max_tokens: int) -> list[int]:
    """Token counts captured: powers of two to 256, then every 256 to FINE_UP_TO and every 512 beyond, up to
    ``max_tokens`` (at most MAX_TOKENS)."""
    cap = min(max_tokens, MAX_TOKENS)
    sizes = [s for s in (16, 32, 64, 128) if s < cap] + list(range(256, min(cap, FINE_UP_TO) + 1, 256))
    sizes += list(range(FINE_UP_TO + 512, cap + 1, 512))
    if not sizes or sizes[-1] != cap:
        sizes.append(cap)
    return sizes


class PiecewiseGraphs:
    def __init__(self, model: torch.nn.Module, kv_caches: list[torch.Tensor], buffers: GraphBuffers, sizes: list[int],
                 dtype: torch.dtype) -> None:
        """``buffers``: the static inputs, outputs and memory pool shared with the full graphs (never replayed at
        the same time). Not for expert parallelism, whose eager passes pad to every DP rank's token count."""
        self.model = model
        self.buffers = buffers
        self.sizes = sorted(sizes)
        max_tokens = self.sizes[-1]
        device = buffers.input_ids.device
        first = next(m for m in model.modules() if isinstance(m, Attention))
        self.query = torch.zeros(max_tokens, first.num_heads, first.head_dim, dtype=dtype, device=device)
        self.attention_out = torch.zeros_like(self.query)
        self.pieces: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self.attentions: dict[int, list[tuple[Attention, torch.Tensor]]] = {}  # per cut: the layer and its KV cache
        self.num_replays = 0  # passes run through the pieces
        self.stream = capture_stream(device.index)  # capture needs a stream other than the default one
        for size in reversed(self.sizes):  # largest first: the smaller sizes fit in the pool it leaves
            self._capture(size, kv_caches)
        torch.cuda.synchronize()
        logger.info("captured piecewise CUDA graphs (%d pieces each) for token counts %s", len(self.pieces[max_tokens]), self.sizes)

    def _stage(self, attention: Attention, q, k, v, kv_cache) -> torch.Tensor:
        """What a cut records in the piece before it: keys and values to the cache, queries to their buffer."""
        n = q.shape[0]
        attention.store(k, v, kv_cache, self.buffers.slot_mapping[:n])
        self.query[:n].copy_(q)
        return self.attention_out[:n].view(n, -1)

    @torch.inference_mode()
    def _capture(self, size: int, kv_caches: list[torch.Tensor]) -> None:
        args = self.buffers.model_args(size, kv_caches, None)
        keep = self.buffers.keep
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            with attention_cut(self._stage):  # warm-up on the capture stream: Triton compiles, cuBLAS sets up, outside any capture
                for _ in range(2):
                    keep(self.model(*args))
            self.stream.synchronize()
            pieces: list[torch.cuda.CUDAGraph] = []
            attentions: list[tuple[Attention, torch.Tensor]] = []

            def begin() -> None:
                pieces.append(torch.cuda.CUDAGraph())
                pieces[-1].capture_begin(pool=self.buffers.pool)

            def cut(attention: Attention, q, k, v, kv_cache) -> torch.Tensor:
                out = self._stage(attention, q, k, v, kv_cache)
                pieces[-1].capture_end()
                attentions.append((attention, kv_cache))
                begin()
                return out

            begin()
            with attention_cut(cut):
                keep(self.model(*args))
            pieces[-1].capture_end()
        torch.cuda.current_stream().wait_stream(self.stream)
        self.pieces[size], self.attentions[size] = pieces, attentions

    def padded_size(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    def run(self, size: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, intermediate=None):
        """The pass at ``size`` (>= the step's tokens) with attention over ``meta``; returns what the model
        returns, for the step's rows."""
        n = self.buffers.prepare(size, input_ids, positions, meta, intermediate)
        self.num_replays += 1
        query, out = self.query[:n], self.attention_out[:n]
        pieces = self.pieces[size]
        for piece, (attention, kv_cache) in zip(pieces, self.attentions[size]):
            piece.replay()
            attention.attend(query, kv_cache, meta, out=out)
        pieces[-1].replay()
        return self.buffers.result(n)
