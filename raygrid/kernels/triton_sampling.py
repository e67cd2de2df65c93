"""Triton kernel of the Gumbel-max draw (definition: ``sampling_ref.gumbel_argmax_ref``).

One pass over the logits in their own dtype: the penalties where a row has any, temperature, noise from a Philox
stream keyed by the row's seed, and a running argmax, with no float32 copy of the ``[B, V]`` logits and no softmax.
Each program takes one chunk of one row; a second launch picks each row's best chunk (one launch, not the four
torch calls of an argmax and a gather: at batch 1 a step's host time is mostly such calls).
Ties go to the lowest token id, as ``torch.argmax`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.sampling_ref import GREEDY_TEMPERATURE, Penalties


@triton.jit
def _tile_columns(start, QUARTER: tl.constexpr):
    """Columns of a ``[QUARTER, 4]`` tile: ``start + 4 * i + k``, contiguous in memory."""
    return start + tl.arange(0, QUARTER)[:, None] * 4 + tl.arange(0, 4)[None, :]


@triton.jit
def _tile_uniform(seed, start, QUARTER: tl.constexpr):
    """Uniforms in [0, 1) for ``_tile_columns(start)``: one Philox call per tile row gives all four of its
    columns (Philox is the kernel's main cost, so this is four times cheaper than one call a column)."""
    u0, u1, u2, u3 = tl.rand4x(seed, start // 4 + tl.arange(0, QUARTER))
    k = tl.arange(0, 4)[None, :]
    return tl.where(k == 0, u0[:, None], tl.where(k == 1, u1[:, None], tl.where(k == 2, u2[:, None], u3[:, None])))


@triton.jit
def _exponential(u):
    """-log(u), an Exp(1) variate, for u in [0, 1). Near u = 1 it is smallest and decides the draw
    (the noise is -log of it); there a series keeps its relative precision, which a fast hardware
    log would lose."""
    v = 1.0 - u
    series = v * (1.0 + v * (0.5 + v * (0.33333334 + v * 0.25)))
    return tl.where(v < 0.0078125, series, -tl.log(u))


@triton.jit
def _penalize(x, count, prompt, repetition, frequency, presence):
    """vLLM's penalties on float32 logits ``x`` (``sampling_ref.apply_penalties_ref``): a token seen in the prompt or
    among the outputs (``count`` > 0) is divided by ``repetition`` where positive and multiplied by it elsewhere;
    then ``frequency`` times its count and ``presence`` where it is among the outputs are subtracted."""
    present = count > 0
    scaled = tl.where(x > 0, x / repetition, x * repetition)
    return tl.where((prompt != 0) | present, scaled, x) - frequency * count - presence * present.to(tl.float32)


# ``penalties`` and the statistics' stride vary at run time only: a batch with penalties launches the variant one
# without them does (the pointers' dtypes are the same, see gumbel_argmax), so no request waits for a compile.
@triton.jit(do_not_specialize=["penalties", "stride_counts"])
def _gumbel_argmax_kernel(
    logits_ptr, temperature_ptr, seeds_ptr, best_value_ptr, best_index_ptr, stride_row, vocab_size,
    penalties, counts_ptr, in_prompt_ptr, slots_ptr, repetition_ptr, frequency_ptr, presence_ptr, stride_counts,
    NUM_CHUNKS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, GREEDY_BELOW: tl.constexpr,
):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    temperature = tl.load(temperature_ptr + row)
    seed = tl.load(seeds_ptr + row)
    # A row's penalties (none where ``penalties`` is 0: the pointers are then stand-ins, never read).
    given = penalties != 0
    repetition = tl.load(repetition_ptr + row, mask=given, other=1.0)
    frequency = tl.load(frequency_ptr + row, mask=given, other=0.0)
    presence = tl.load(presence_ptr + row, mask=given, other=0.0)
    slot = tl.load(slots_ptr + row, mask=given, other=0).to(tl.int64)
    penalized = (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0)
    best_value = tl.full([BLOCK // 4, 4], float("-inf"), dtype=tl.float32)
    best_index = tl.zeros([BLOCK // 4, 4], dtype=tl.int32)
    for start in range(chunk * CHUNK, chunk * CHUNK + CHUNK, BLOCK):
        cols = _tile_columns(start, BLOCK // 4)
        valid = cols < vocab_size
        x = tl.load(logits_ptr + row * stride_row + cols, mask=valid, other=float("-inf")).to(tl.float32)
        if penalized:
            count = tl.load(counts_ptr + slot * stride_counts + cols, mask=valid, other=0.0)
            prompt = tl.load(in_prompt_ptr + slot * stride_counts + cols, mask=valid, other=0)
            x = _penalize(x, count, prompt, repetition, frequency, presence)
        if temperature >= GREEDY_BELOW:
            x = x / temperature - tl.log(_exponential(_tile_uniform(seed, start, BLOCK // 4)))
        x = tl.where(valid, x, float("-inf"))
        better = x > best_value  # strict: each lane keeps its earliest maximum
        best_value = tl.where(better, x, best_value)
        best_index = tl.where(better, cols, best_index)
    best_value = tl.reshape(best_value, [BLOCK])
    best_index = tl.reshape(best_index, [BLOCK])
    top = tl.max(best_value, 0)
    index = tl.min(tl.where(best_value == top, best_index, vocab_size), 0)
    tl.store(best_value_ptr + row * NUM_CHUNKS + chunk, top)
    tl.store(best_index_ptr + row * NUM_CHUNKS + chunk, tl.minimum(index, vocab_size - 1))


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, penalties: Penalties | None = None,
                  block: int = 1024, chunk: int = 8192) -> torch.Tensor:
    """logits ``[B, V]`` (rows contiguous), temperature ``[B]`` float32, seeds ``[B]`` int64 -> tokens ``[B]`` int64.
    ``penalties``: applied to each tile of logits as it is read (``sampling_ref.apply_penalties_ref``, in float32)."""
    num_rows, vocab_size = logits.shape
    assert logits.stride(1) == 1, "logits rows must be contiguous"
    block = max(16, min(block, triton.next_power_of_2(vocab_size)))
    chunk = max(block, min(chunk, triton.cdiv(vocab_size, block) * block))
    num_chunks = triton.cdiv(vocab_size, chunk)
    tokens = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows:
        given = penalties is not None
        if not given:  # stand-ins of the same dtypes, never read (another dtype would make another compiled variant)
            penalties = Penalties(temperature[:, None], seeds.view(torch.bool)[:, None], seeds, temperature, temperature, temperature)
        counts, in_prompt = _statistics(penalties)
        best_value = torch.empty(num_rows, num_chunks, dtype=torch.float32, device=logits.device)
        best_index = torch.empty(num_rows, num_chunks, dtype=torch.int32, device=logits.device)
        _gumbel_argmax_kernel[(num_rows, num_chunks)](
            logits, temperature, seeds, best_value, best_index, logits.stride(0), vocab_size,
            int(given), counts, in_prompt, penalties.slots, penalties.repetition, penalties.frequency, penalties.presence,
            counts.stride(0),
            NUM_CHUNKS=num_chunks, CHUNK=chunk, BLOCK=block, GREEDY_BELOW=GREEDY_TEMPERATURE, num_warps=4,
        )
        _best_chunk_kernel[(num_rows,)](best_value, best_index, tokens, NUM_CHUNKS=num_chunks,
                                        BLOCK_C=triton.next_power_of_2(num_chunks), num_warps=1)
    return tokens


@triton.jit
def _best_chunk_kernel(best_value_ptr, best_index_ptr, tokens_ptr, NUM_CHUNKS: tl.constexpr, BLOCK_C: tl.constexpr):
    """Each row's token: the id its best chunk found, the first best chunk (it holds the lowest tied id)."""
    row = tl.program_id(0)
    chunks = tl.arange(0, BLOCK_C)
    values = tl.load(best_value_ptr + row * NUM_CHUNKS + chunks, mask=chunks < NUM_CHUNKS, other=float("-inf"))
    first = tl.min(tl.where(values == tl.max(values, 0), chunks, NUM_CHUNKS - 1), 0)
    tl.store(tokens_ptr + row, tl.load(best_index_ptr + row * NUM_CHUNKS + first).to(tl.int64))


@triton.jit
def _philox_uniform_kernel(seeds_ptr, out_ptr, vocab_size, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    cols = _tile_columns(start, BLOCK // 4)
    seed = tl.load(seeds_ptr + row)
    tl.store(out_ptr + row * vocab_size + cols, _tile_uniform(seed, start, BLOCK // 4), mask=cols < vocab_size)


def philox_uniform(seeds: torch.Tensor, vocab_size: int, block: int = 1024) -> torch.Tensor:
    """The uniforms ``gumbel_argmax`` draws for each row's seed, as a ``[B, V]`` tensor (for its tests)."""
    out = torch.empty(seeds.shape[0], vocab_size, dtype=torch.float32, device=seeds.device)
    block = max(16, min(block, triton.next_power_of_2(vocab_size)))
    _philox_uniform_kernel[(seeds.shape[0], triton.cdiv(vocab_size, block))](seeds, out, vocab_size, BLOCK=block)
    return out


# The bitmask's width comes from the tokenizer, the logits' from the model: left to Triton, a width that is a multiple of
# 16 would compile a variant of its own, and the engine's warm-up could not know which one requests will launch.
@triton.jit(do_not_specialize=["stride_mask", "vocab_size", "num_words"])
def _token_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, mask_rows_ptr, stride_logits, stride_mask, vocab_size, num_words,
                          WORDS: tl.constexpr):
    """One program: ``WORDS`` words (32 tokens each) of one row; refused tokens' logits become -inf."""
    i = tl.program_id(0)
    row = tl.load(rows_ptr + i).to(tl.int64)
    mask_row = tl.load(mask_rows_ptr + i).to(tl.int64)
    words = tl.program_id(1) * WORDS + tl.arange(0, WORDS)
    bits = tl.load(bitmask_ptr + mask_row * stride_mask + words, mask=words < num_words, other=0)
    tokens = words[:, None] * 32 + tl.arange(0, 32)[None, :]
    refused = ((bits[:, None] >> tl.arange(0, 32)[None, :]) & 1) == 0
    tl.store(logits_ptr + row * stride_logits + tokens, tl.full([WORDS, 32], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
             mask=refused & (tokens < vocab_size))


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, mask_rows: torch.Tensor) -> None:
    """``sampling_ref.apply_token_bitmask_ref`` in one pass: reads the bitmask, writes only the refused logits."""
    vocab = logits.shape[1]
    words_per_row = triton.cdiv(vocab, 32)
    words = 32 if logits.is_cuda else 8
    grid = (rows.shape[0], triton.cdiv(words_per_row, words))
    _token_bitmask_kernel[grid](logits, bitmask, rows, mask_rows, logits.stride(0), bitmask.stride(0), vocab,
                                min(bitmask.shape[1], words_per_row), WORDS=words)


def _statistics(penalties: Penalties) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots' counts and prompt masks as the penalty kernels read them: rows contiguous, one stride for both (the
    masks as bytes)."""
    assert penalties.counts.stride(1) == 1 and penalties.in_prompt.stride() == penalties.counts.stride()
    return penalties.counts, penalties.in_prompt.view(torch.uint8)


@triton.jit(do_not_specialize=["stride_logits", "stride_counts", "vocab_size"])
def _penalties_kernel(logits_ptr, counts_ptr, in_prompt_ptr, slots_ptr, repetition_ptr, frequency_ptr, presence_ptr,
                      stride_logits, stride_counts, vocab_size, BLOCK: tl.constexpr):
    """One program: ``BLOCK`` tokens of one row, read and written once. Rows without penalties return at once."""
    row = tl.program_id(0)
    repetition = tl.load(repetition_ptr + row)
    frequency = tl.load(frequency_ptr + row)
    presence = tl.load(presence_ptr + row)
    if (repetition != 1.0) | (frequency != 0.0) | (presence != 0.0):
        slot = tl.load(slots_ptr + row).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        valid = cols < vocab_size
        x = tl.load(logits_ptr + row * stride_logits + cols, mask=valid)
        count = tl.load(counts_ptr + slot * stride_counts + cols, mask=valid, other=0.0)
        prompt = tl.load(in_prompt_ptr + slot * stride_counts + cols, mask=valid, other=0)
        tl.store(logits_ptr + row * stride_logits + cols, _penalize(x, count, prompt, repetition, frequency, presence), mask=valid)


def apply_penalties(logits: torch.Tensor, penalties: Penalties, block: int = 2048) -> torch.Tensor:
    """``sampling_ref.apply_penalties_ref`` in one pass, in place on float32 ``logits``: no ``[B, V]`` gather of the
    slots' statistics and no intermediate ``[B, V]`` tensors. (The draw applies them itself, ``gumbel_argmax``; this
    is for the paths that need the penalized logits: truncation by top-k, top-p or min-p.)"""
    num_rows, vocab_size = logits.shape
    counts, in_prompt = _statistics(penalties)
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    if num_rows:
        block = max(16, min(block, triton.next_power_of_2(vocab_size)))
        _penalties_kernel[(num_rows, triton.cdiv(vocab_size, block))](
            logits, counts, in_prompt, penalties.slots, penalties.repetition, penalties.frequency,
            penalties.presence, logits.stride(0), counts.stride(0), vocab_size, BLOCK=block, num_warps=4)
    return logits


@triton.jit
def _logprob_stats_kernel(logits_ptr, tokens_ptr, lse_ptr, token_logit_ptr, rank_ptr, stride_row, vocab_size, BLOCK: tl.constexpr):
    """One program a row, one pass over it: a running max and sum of exponentials per lane (the log-sum-exp), and
    how many logits exceed the token's."""
    row = tl.program_id(0).to(tl.int64)
    token = tl.load(tokens_ptr + row)
    token_logit = tl.load(logits_ptr + row * stride_row + token).to(tl.float32)
    top = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    total = tl.zeros([BLOCK], dtype=tl.float32)
    above = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, vocab_size, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * stride_row + cols, mask=cols < vocab_size, other=float("-inf")).to(tl.float32)
        new_top = tl.maximum(top, x)
        shift = tl.where(new_top > float("-inf"), new_top, 0.0)  # a lane that has seen only -inf keeps 0 (no NaN)
        total = total * tl.exp(top - shift) + tl.exp(x - shift)
        top = new_top
        above += (x > token_logit).to(tl.int32)
    row_top = tl.max(top, 0)
    row_shift = tl.where(row_top > float("-inf"), row_top, 0.0)
    tl.store(lse_ptr + row, row_shift + tl.log(tl.sum(total * tl.exp(top - row_shift), 0)))
    tl.store(token_logit_ptr + row, token_logit)
    tl.store(rank_ptr + row, tl.sum(above, 0).to(tl.int64) + 1)


def logprob_stats(logits: torch.Tensor, tokens: torch.Tensor, block: int = 4096) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sampling_ref.logprob_stats_ref`` in one pass over the logits in their own dtype (no float32 copy, no
    ``[B, V]`` log-softmax)."""
    num_rows, vocab_size = logits.shape
    assert logits.stride(1) == 1, "logits rows must be contiguous"
    lse = torch.empty(num_rows, dtype=torch.float32, device=logits.device)
    token_logits = torch.empty_like(lse)
    ranks = torch.empty(num_rows, dtype=torch.int64, device=logits.device)
    if num_rows:
        block = max(16, min(block, triton.next_power_of_2(vocab_size)))
        _logprob_stats_kernel[(num_rows,)](logits, tokens.long(), lse, token_logits, ranks, logits.stride(0), vocab_size,
                                           BLOCK=block, num_warps=8)
    return lse, token_logits, ranks
