"""Sizing the KV cache: the passes that measure the worst step's peak memory (a forward pass of the whole token
budget on a throwaway cache, then sampling with every feature on) and what the CUDA graphs will hold, on one
device. The worker turns them into a number of KV blocks (``Worker.determine_num_kv_blocks``). On a CPU: the pool's
tensors (``zeroed_cache``) and its check against the host's memory (``check_host_pool``)."""

from __future__ import annotations

import dataclasses
import math
import mmap
from typing import TYPE_CHECKING

import torch

from raygrid.engine.sampler import SamplingMetadata
from raygrid.kernels.ops import apply_token_bitmask
from raygrid.models.layers.attention import AttentionMetadata

if TYPE_CHECKING:
    from raygrid.engine.model_runner import ModelRunner


# A sequence of each length launches one of the prefill attention kernel's shapes (triton_attention.prefill_launch):
# the whole budget, on Hopper the Gluon kernel of long prompts; 256 tokens, the Triton kernel's long query tiles; 16,
# its short ones. Passes of the last two after the first compile their launches here, not while a user's first such
# prompt waits: where the first pass took the Gluon kernel, nothing at start launched the long tiles (the mixed steps'
# graphs capture the short ones), and a variant costs 0.4 to 2 s to compile on an H200.
_WARM_PREFILL_LENGTHS = (256, 16)


@torch.inference_mode()
def profile_forward(runner: ModelRunner, num_tokens: int) -> None:
    """The worst step for peak memory: a forward pass of ``num_tokens`` prompt tokens with a throwaway
    KV cache, then (last pipeline stage) sampling for ``max_num_seqs`` rows with every feature on; then short prompt
    passes, which compile the prefill launches the first one did not take."""
    blocks = -(-num_tokens // runner.block_size)
    caches = runner.allocate_kv_cache(blocks + 1)
    out = _prompt_pass(runner, num_tokens, caches)
    for length in _WARM_PREFILL_LENGTHS:  # less memory than the first: the peak stays the first pass's
        _prompt_pass(runner, min(length, num_tokens), caches)
    del caches  # before sampling, as a step's sampling does not hold a second KV cache
    if runner.pp.is_last:
        rows = runner.config.scheduler.max_num_seqs
        hidden = out[-1:].expand(rows, -1) if num_tokens < rows else out[-rows:]
        del out
        _profile_sampler(runner, runner.model.compute_logits(hidden))


def _prompt_pass(runner: ModelRunner, num_tokens: int, caches: list[torch.Tensor]):
    """One sequence's first ``num_tokens`` prompt tokens through this rank's layers, on ``caches`` from block 1."""
    ids = torch.zeros(num_tokens, dtype=torch.long, device=runner.device)
    # Positions as a real step's: each under max_model_len (the budget may exceed the rotary tables' length).
    positions = torch.arange(num_tokens, device=runner.device) % runner.config.model.max_model_len
    meta = single_sequence_metadata(num_tokens, runner.block_size, runner.device, first_block=1)
    intermediate = None
    if not runner.pp.is_first:
        zeros = torch.zeros(num_tokens, runner.model.config.hidden_size, dtype=runner.dtype, device=runner.device)
        intermediate = (zeros, zeros.clone())
    return runner.forward(runner.passes.plan(None, num_tokens, -1), ids, positions, meta, intermediate, kv_caches=caches)


def _profile_sampler(runner: ModelRunner, logits: torch.Tensor) -> None:
    """Sampling's largest footprint: penalties on every row (their counts kept across steps are allocated here, so the
    KV cache is sized with them held), min_p, top-k and top-p (a full sort), a ban and a bias, an allowed-token mask
    and ``max_logprobs`` top logprobs, on every row."""
    rows, dev = logits.shape[0], runner.device
    slots = torch.arange(rows, device=dev)
    counts, in_prompt = runner.sampling_inputs.token_counts.buffers()
    full = lambda value, dtype=torch.float32: torch.full((rows,), value, dtype=dtype, device=dev)  # noqa: E731
    meta = SamplingMetadata(
        temperature=full(0.7), greedy=full(False, torch.bool), all_greedy=False,
        top_k=full(50, torch.int64), top_p=full(0.9), min_p=full(0.05),
        repetition_penalty=full(1.1), frequency_penalty=full(0.1), presence_penalty=full(0.1),
        penalty_slots=slots, slot_counts=counts, slot_in_prompt=in_prompt,
        adjust_rows=torch.arange(rows, device=dev).repeat(2), adjust_tokens=torch.zeros(2 * rows, dtype=torch.int64, device=dev),
        adjust_values=torch.zeros(2 * rows, device=dev), allowed_rows=torch.arange(rows, device=dev),
        allowed_mask=torch.zeros(rows, runner.vocab_size, device=dev),
        seeds=full(1, torch.int64), num_logprobs=[runner.config.model.max_logprobs] * rows,
    )
    # Structured outputs refuse tokens before sampling: a Triton kernel of its own, compiled here rather than while
    # the first request with a grammar waits (every bit set: nothing refused).
    all_rows = torch.arange(rows, device=dev)
    apply_token_bitmask(logits, torch.full((rows, -(-runner.vocab_size // 32)), -1, dtype=torch.int32, device=dev), all_rows, all_rows)
    runner.sampler(logits, meta)
    # Temperature alone draws from the logits in the model's dtype, where the path above draws from float32
    # ones: a Triton variant of its own, compiled here rather than while the first such request waits.
    none = dict.fromkeys(["top_k", "top_p", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty",
                          "penalty_slots", "slot_counts", "slot_in_prompt", "adjust_rows", "adjust_tokens", "adjust_values",
                          "allowed_rows", "allowed_mask"])
    runner.sampler(logits, dataclasses.replace(meta, **none, num_logprobs=[None] * rows))


@torch.inference_mode()
def profile_cuda_graphs(runner: ModelRunner) -> int:
    """Device memory the CUDA graphs will hold (0 without graphs). All sizes share one memory pool, which the
    largest sizes size, so capture those on a throwaway KV cache and measure. Beyond the pool each graph holds
    memory of its own (its instantiated nodes), about as much for every size of a kind: what the captured ones
    hold outside the pool counts once more for each size left out."""
    if not runner.uses_cuda_graphs:
        return 0
    caches = runner.allocate_kv_cache(2)  # captures store nothing (slot -1) and attend over nothing (length 0)
    free_before, reserved_before = free_device_memory(), torch.cuda.memory_reserved()
    graphs = runner.capture_graphs(caches, largest_only=True)
    taken = free_before - free_device_memory()
    outside_pool = max(taken - (torch.cuda.memory_reserved() - reserved_before), 0)
    kinds = [len(sizes) for sizes in runner.graph_sizes() if sizes]
    taken += outside_pool * (sum(kinds) - len(kinds)) // len(kinds)
    del graphs, caches
    torch.cuda.empty_cache()
    return taken


def single_sequence_metadata(num_tokens: int, block_size: int, device: torch.device, first_block: int) -> AttentionMetadata:
    """Attention inputs of one sequence of ``num_tokens`` prompt tokens in consecutive blocks from ``first_block``
    (block 0 is the null block, which nothing reads). The block table is int32, as a step's staged one: a Triton
    kernel compiles a variant for each dtype it is given, and the memory profile's pass should compile the ones
    that steps launch, not one that users' first prompts then wait for (benchmarks/README.md)."""
    blocks = -(-num_tokens // block_size)
    table = torch.arange(first_block, first_block + blocks, dtype=torch.int32, device=device)[None, :]
    return sequence_metadata(table, 0, num_tokens, block_size)[1]


def sequence_metadata(block_table: torch.Tensor, start: int, count: int, block_size: int) -> tuple[torch.Tensor, AttentionMetadata]:
    """Positions and attention inputs of ``count`` tokens of one sequence from position ``start``, whose blocks are
    ``block_table`` (``[1, blocks]`` int32, on the tokens' device): a prompt chunk, or one decode token."""
    device = block_table.device
    positions = torch.arange(start, start + count, device=device)
    seq_len = start + count
    return positions, AttentionMetadata(
        slot_mapping=block_table[0, positions // block_size].long() * block_size + positions % block_size,
        block_tables=block_table,
        seq_lens=[seq_len],
        query_start_loc=[0, count],
        max_query_len=count,
        seq_lens_tensor=torch.tensor([seq_len], dtype=torch.int32, device=device),
        query_start_loc_tensor=torch.tensor([0, count], dtype=torch.int32, device=device),
        decode_order=torch.zeros(1, dtype=torch.int32, device=device),  # a decode pass (one token) launches as steps do
    )


def decode_metadata(slots: torch.Tensor, table: torch.Tensor, seq_lens: torch.Tensor) -> AttentionMetadata:
    """Attention inputs of a decode step, one token a row: its cache slot (``slots``), the row's pages (``table``) and
    its context with the token (``seq_lens``, int32), the rows started longest first as a step's are."""
    rows = seq_lens.shape[0]
    return AttentionMetadata(
        slot_mapping=slots, block_tables=table, seq_lens=seq_lens.tolist(), query_start_loc=list(range(rows + 1)),
        max_query_len=1, seq_lens_tensor=seq_lens,
        query_start_loc_tensor=torch.arange(rows + 1, dtype=torch.int32, device=seq_lens.device),
        decode_order=torch.argsort(-seq_lens, stable=True).to(torch.int32))


def kv_cache_shape(model: torch.nn.Module, block_size: int, num_blocks: int) -> tuple[int, ...]:
    """KV cache shape of one layer on this rank (its share of the kv heads)."""
    attn = model.layers[0].self_attn
    return (2, num_blocks, block_size, attn.num_kv_heads, attn.head_dim)


def zeroed_cache(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A KV cache tensor of zeros (a slot never written must not hold NaN: attention weighs it by 0, and 0 x NaN is
    NaN). On the CPU from an anonymous private mapping, which the kernel fills with zero pages as they are first
    touched: torch.zeros writes the whole pool at start (a CPU pool of 1 GiB a worker: 0.35 s alone, over 1 s in a
    busy start) and keeps all of it resident, however little the engine uses. The mapping goes with the tensor."""
    if device.type != "cpu" or math.prod(shape) == 0:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, math.prod(shape) * dtype.itemsize, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(pages, dtype=dtype).view(shape)


def check_host_pool(num_blocks: int, bytes_per_block: int, num_kv_blocks_set: bool) -> None:
    """Refuse, in one line naming what set its size, a CPU KV pool larger than the host's available memory: its
    pages are mapped as they are touched, so an oversized pool would otherwise start and be killed mid-run."""
    available = host_memory_available()
    needed = num_blocks * bytes_per_block
    if available is not None and needed > available:
        field = f"num_kv_blocks ({num_blocks})" if num_kv_blocks_set else f"the CPU KV pool ({num_blocks} blocks)"
        raise ValueError(f"{field}: {needed / 2**30:.1f} GiB of KV cache a worker, more than this host's available "
                         f"memory ({available / 2**30:.1f} GiB)")


def host_memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping), or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_device_memory() -> int:
    """Free device bytes once queued work is done and the allocator's unused cache is released, so a
    difference of two readings is memory that something still holds."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]
