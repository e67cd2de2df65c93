"""Every Triton kernel against its torch reference on random inputs. On CPU they run under
TRITON_INTERPRET=1 at tiny sizes (conftest sets it); on a GPU at real sizes."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is a test dependency; install raygrid[test]")

from raygrid.kernels.elementwise_ref import (  # noqa: E402
    apply_rotary_ref,
    rms_norm_ref,
    silu_and_mul_ref,
)
from raygrid.kernels.moe_ref import align_by_expert_ref, fused_moe_ref, route_ref  # noqa: E402
from raygrid.kernels.paged_attention_ref import paged_attention_ref, store_kv_ref  # noqa: E402
from raygrid.kernels.sampling_ref import (  # noqa: E402
    Penalties,
    apply_penalties_ref,
    apply_token_bitmask_ref,
    gumbel_scores,
    logprob_stats_ref,
)
from raygrid.kernels.triton_attention import (  # noqa: E402
    paged_attention_decode,
    paged_attention_prefill,
    store_kv,
)
from raygrid.kernels.triton_moe import TILES, align_by_expert, fused_moe  # noqa: E402
from raygrid.kernels.triton_ops import qk_norm_rotary, rms_norm, rotary_inplace, silu_and_mul  # noqa: E402
from raygrid.kernels.triton_sampling import (  # noqa: E402
    apply_penalties,
    apply_token_bitmask,
    gumbel_argmax,
    logprob_stats,
    philox_uniform,
)

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# CPU (interpreted): tiny shapes in float32; GPU: real shapes in bfloat16 too.
DTYPES = [torch.float32, torch.bfloat16] if ON_GPU else [torch.float32]


def tol(dtype):
    return dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-5, rtol=1e-4)


# Keys of 400 times the others' size make scores of hundreds: float32's summation order then moves the softmax by up
# to 7e-5 (on CPU, 3 of 700 random draws of the bulk-copy tests went over 2e-5), so float32 gets 1e-4 there.
def spike_tol(dtype):
    return tol(dtype) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(autouse=True)
def _seeded():
    """Each test draws the same random inputs on every run (a failure reproduces)."""
    torch.manual_seed(0)


def make_cache(num_blocks, block_size, kv_heads, head_dim, dtype):
    return torch.randn(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=DEVICE)


def random_block_tables(seq_lens, block_size, num_blocks):
    """Disjoint random blocks per sequence (block 0 is the null block), padded with 0."""
    free = list(range(1, num_blocks))
    random.Random(0).shuffle(free)
    width = max(-(-n // block_size) for n in seq_lens)
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for i, n in enumerate(seq_lens):
        for j in range(-(-n // block_size)):
            table[i, j] = free.pop()
    return table.to(DEVICE)


def prefill_case(cases, block_size, heads, kv_heads, head_dim, dtype):
    """A batch of (cached context, new queries) sequences: a random cache, their block tables, lengths, query starts
    and packed queries."""
    seq_lens = [c + q for c, q in cases]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype)
    tables = random_block_tables(seq_lens, block_size, num_blocks)
    starts = [0]
    for _, q in cases:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], heads, head_dim, dtype=dtype, device=DEVICE)
    return cache, tables, seq_lens, starts, query


SHAPES = [
    # heads, kv_heads, head_dim, block_size
    (4, 2, 16, 4) if not ON_GPU else (16, 8, 128, 16),
    (4, 4, 32, 8) if not ON_GPU else (32, 8, 64, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", SHAPES)
def test_store_kv(dtype, heads, kv_heads, head_dim, block_size):
    num_blocks, tokens = 12, 20
    cache_a = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype)
    cache_b = cache_a.clone()
    key = torch.randn(tokens, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    value = torch.randn(tokens, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    slots[3] = -1  # padding
    store_kv_ref(key, value, cache_a, slots)
    store_kv(key, value, cache_b, slots)
    assert torch.equal(cache_a, cache_b)


# None: as many context splits as the GPU wants for this batch (16 for six sequences on an H200).
SPLITS = [1, 3, None] if ON_GPU else [1, 3]


@pytest.mark.parametrize("num_splits", SPLITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", SHAPES)
def test_decode_attention(dtype, heads, kv_heads, head_dim, block_size, num_splits):
    seq_lens = [1, 7, 33, 64, 5] if not ON_GPU else [1, 17, 300, 1024, 2000, 77]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    cache = make_cache(num_blocks, block_size, kv_heads, head_dim, dtype)
    tables = random_block_tables(seq_lens, block_size, num_blocks)
    query = torch.randn(len(seq_lens), heads, head_dim, dtype=dtype, device=DEVICE)
    scale = head_dim**-0.5
    expected = paged_attention_ref(query, cache, tables, seq_lens, list(range(len(seq_lens) + 1)), scale)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    # Slices of at least 16 tokens: on CPU's short sequences too, several slices hold keys.
    got = paged_attention_decode(query, cache, tables, lens, scale, block_n=16, num_splits=num_splits, min_split_tokens=16)
    torch.testing.assert_close(got, expected, **tol(dtype))


# float32 on the CPU; on a GPU bf16, the dtype the engine brings tiles in bulk for.
@pytest.mark.parametrize("dtype", [torch.bfloat16] if ON_GPU else [torch.float32])
def test_decode_attention_by_bulk_copies_of_whole_page_tiles(dtype):
    """Pages of a multiple of block_n tokens: the decode kernel brings each key and value tile with one bulk copy
    (TMA), whole or split into slices. The slots past a sequence's end in its last page hold NaN and must not leak
    in; keys of 400 times the others' size in a later page must move the running max."""
    from raygrid.kernels.triton_attention import _tma_fits

    heads, kv_heads, head_dim, page = (4, 2, 16, 32) if not ON_GPU else (16, 8, 128, 64)
    seq_lens = [1, 9, 70, 33, 64] if not ON_GPU else [1, 17, 300, 1024, 2000, 77]
    num_blocks = sum(-(-n // page) for n in seq_lens) + 4
    cache = make_cache(num_blocks, page, kv_heads, head_dim, dtype)
    tables = random_block_tables(seq_lens, page, num_blocks)
    for row, n in enumerate(seq_lens):
        cache[:, tables[row, (n - 1) // page], (n - 1) % page + 1 :] = float("nan")
    cache[0, tables[2, 1], 8:12] *= 400
    query = torch.randn(len(seq_lens), heads, head_dim, dtype=dtype, device=DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    expected = paged_attention_ref(query, cache, tables, seq_lens, list(range(len(seq_lens) + 1)), scale)
    for block_n, splits in [(page, 1), (page // 2, 1), (page // 2, 3)]:
        assert _tma_fits(cache[0], block_n)
        got = paged_attention_decode(query, cache, tables, lens, scale, block_n=block_n, num_splits=splits,
                                     min_split_tokens=page, tma=True)
        torch.testing.assert_close(got, expected, **spike_tol(dtype))
    fp8 = cache.clamp(-448, 448).to(torch.float8_e4m3fn)  # an FP8 cache: its tiles come as float8, read as float16
    got = paged_attention_decode(query, fp8, tables, lens, scale, block_n=page, num_splits=1, tma=True)
    torch.testing.assert_close(got, paged_attention_ref(query, fp8, tables, seq_lens, list(range(len(seq_lens) + 1)), scale),
                               **spike_tol(dtype))


@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_programs_in_any_order_write_the_same_output(num_splits):
    """Sequences started in a given order (the engine's: longest first) write every row where it belongs: the same
    output as in the batch's order."""
    heads, kv_heads, head_dim, block_size = SHAPES[-1]
    seq_lens = [1, 7, 33, 64, 5, 0] if not ON_GPU else [1, 17, 300, 1024, 2000, 77, 0]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    cache = make_cache(num_blocks, block_size, kv_heads, head_dim, DTYPES[-1])
    tables = random_block_tables(seq_lens, block_size, num_blocks)
    query = torch.randn(len(seq_lens), heads, head_dim, dtype=DTYPES[-1], device=DEVICE)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    plain = paged_attention_decode(query, cache, tables, lens, 0.1, block_n=16, num_splits=num_splits, min_split_tokens=16)
    torch.testing.assert_close(plain, paged_attention_ref(query, cache, tables, seq_lens, list(range(len(seq_lens) + 1)), 0.1),
                               **tol(DTYPES[-1]))
    for order in [torch.argsort(lens, descending=True), torch.randperm(len(seq_lens), device=DEVICE)]:
        got = paged_attention_decode(query, cache, tables, lens, 0.1, block_n=16, num_splits=num_splits,
                                     min_split_tokens=16, order=order.int())
        assert torch.equal(got, plain), order


@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_padding_rows_are_zero(num_splits):
    heads, kv_heads, head_dim, block_size = SHAPES[0]
    cache = make_cache(8, block_size, kv_heads, head_dim, torch.float32)
    tables = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    tables[0, 0] = 1
    query = torch.randn(2, heads, head_dim, device=DEVICE)
    lens = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    out = paged_attention_decode(query, cache, tables, lens, 0.1, block_n=16, num_splits=num_splits, min_split_tokens=16)
    assert torch.count_nonzero(out[1]) == 0 and torch.isfinite(out).all()


@pytest.mark.skipif(not ON_GPU, reason="a cache half of more than 2**31 elements (8.6 GB): on the GPU only")
def test_attention_reads_pages_past_2_31_elements_of_a_cache_half():
    """A model of few layers on a large GPU gets a KV half of more than 2**31 elements a layer, so a page's offset
    there needs 64 bits. Two sequences in the pool's last pages, written by store_kv, then read by decode (rows
    gathered through the table, 1 and 3 slices) and by prefill, each against the reference."""
    from raygrid.engine.memory_profile import sequence_metadata

    block_size, heads, kv_heads, head_dim, dtype = 16, 4, 1, 128, torch.bfloat16
    num_blocks = 2**31 // (block_size * kv_heads * head_dim) + 64
    cache = torch.zeros(2, num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=DEVICE)
    seq_lens = [200, 500]
    pages = [-(-n // block_size) for n in seq_lens]
    tables = torch.zeros(2, max(pages), dtype=torch.int32)
    tables[0, : pages[0]] = torch.arange(num_blocks - pages[0], num_blocks)
    tables[1, : pages[1]] = torch.arange(num_blocks - pages[0] - pages[1], num_blocks - pages[0]).flip(0)
    tables = tables.to(DEVICE)
    slots = torch.cat([sequence_metadata(tables[i : i + 1], 0, n, block_size)[1].slot_mapping for i, n in enumerate(seq_lens)])
    keys, values = (torch.randn(len(slots), kv_heads, head_dim, dtype=dtype, device=DEVICE) for _ in range(2))
    store_kv(keys, values, cache, slots)
    assert torch.equal(cache[0].view(-1, kv_heads, head_dim)[slots], keys)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    query = torch.randn(2, heads, head_dim, dtype=dtype, device=DEVICE)
    expected = paged_attention_ref(query, cache, tables, seq_lens, [0, 1, 2], scale)
    for splits in (1, 3):
        got = paged_attention_decode(query, cache, tables, lens, scale, num_splits=splits, min_split_tokens=64)
        torch.testing.assert_close(got, expected, **tol(dtype))
    starts = [0, 30, 60]  # the last 30 tokens of each sequence as new queries
    prompt = torch.randn(60, heads, head_dim, dtype=dtype, device=DEVICE)
    expected = paged_attention_ref(prompt, cache, tables, seq_lens, starts, scale)
    got = paged_attention_prefill(prompt, cache, tables, lens, torch.tensor(starts, dtype=torch.int32, device=DEVICE), scale)
    torch.testing.assert_close(got, expected, **tol(dtype))


# pack: query heads of one kv head that share a program (1, or both heads of a group of two).
@pytest.mark.parametrize("pack", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size", SHAPES)
def test_prefill_attention_with_cached_prefix(dtype, heads, kv_heads, head_dim, block_size, pack):
    # (context already cached, new query tokens): fresh prompts, chunks after a prefix, and decodes, mixed.
    cases = [(0, 9), (12, 5), (0, 1), (20, 1), (3, 30)] if not ON_GPU else [(0, 500), (1000, 300), (0, 1), (77, 1), (16, 129)]
    cache, tables, seq_lens, starts, query = prefill_case(cases, block_size, heads, kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    expected = paged_attention_ref(query, cache, tables, seq_lens, starts, scale)
    got = paged_attention_prefill(
        query, cache, tables, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE), scale, block_m=16, block_n=16,
        pack=pack,
    )
    torch.testing.assert_close(got, expected, **tol(dtype))
    halves = paged_attention_prefill(  # each query tile held as two halves of 16 rows (SUBTILES=2)
        query, cache, tables, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        torch.tensor(starts, dtype=torch.int32, device=DEVICE), scale, block_m=32, block_n=16, pack=pack, subtiles=2,
    )
    torch.testing.assert_close(halves, expected, **tol(dtype))
    if pack == 2:  # the launch prefill_launch picks for this batch (short tiles here on the CPU, prompt tiles on a GPU)
        chosen = paged_attention_prefill(query, cache, tables, torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
                                         torch.tensor(starts, dtype=torch.int32, device=DEVICE), scale)
        torch.testing.assert_close(chosen, expected, **tol(dtype))


# float32 on the CPU; on a GPU bf16, the dtype the engine brings tiles in bulk for (float32 tiles are too large).
@pytest.mark.parametrize("dtype", [torch.bfloat16] if ON_GPU else [torch.float32])
def test_prefill_attention_by_bulk_copies_of_whole_page_tiles(dtype):
    """Pages of a multiple of block_n tokens: each key and value tile lies in one page, and the kernel brings it with
    one bulk tensor copy (TMA) through descriptors over the cache's rows, unmasked; tiles of a whole page and of half
    of one. The slots past a sequence's end in its last page hold anything, NaN here (a freed page's old keys, or
    never written), and must not leak in; nor must keys of 400 times the others' size in a later page (the running
    max must move for them)."""
    from raygrid.kernels.triton_attention import _tma_fits

    heads, kv_heads, head_dim = (4, 2, 16) if not ON_GPU else (16, 8, 128)
    page = 32 if not ON_GPU else 128
    cases = [(0, 9), (16, 21), (0, 1), (70, 3), (3, 30)] if not ON_GPU else [(0, 500), (1000, 300), (0, 1), (77, 1), (16, 129)]
    cache, tables, seq_lens, starts, query = prefill_case(cases, page, heads, kv_heads, head_dim, dtype)
    for row, n in enumerate(seq_lens):
        cache[:, tables[row, (n - 1) // page], (n - 1) % page + 1 :] = float("nan")
    # keys that raise the running max far, in a later page, before every query of the sequence
    spike_row, spike_page = (3, 1) if not ON_GPU else (1, 3)
    cache[0, tables[spike_row, spike_page], 8:12] *= 400
    lens, query_starts = (torch.tensor(v, dtype=torch.int32, device=DEVICE) for v in (seq_lens, starts))

    def bulk(query, cache, tables, scale, **launch):  # the kernel, told to bring tiles by bulk copy (same lengths each call)
        return paged_attention_prefill(query, cache, tables, lens, query_starts, scale, num_stages=2, tma=True, **launch)

    scale = head_dim**-0.5
    expected = paged_attention_ref(query, cache, tables, seq_lens, starts, scale)
    # (block_m, block_n, pack, subtiles): a query tile whole or as two halves
    launches = ([(16, 16, 2, 1), (32, 32, 1, 1), (32, 16, 2, 2)] if not ON_GPU else
                [(128, 64, 2, 1), (128, 128, 2, 1), (16, 64, 2, 1), (128, 64, 2, 2)])
    for block_m, block_n, pack, subtiles in launches:
        assert _tma_fits(cache[0], block_n)
        got = bulk(query, cache, tables, scale, block_m=block_m, block_n=block_n, pack=pack, subtiles=subtiles,
                   num_warps=4 if block_n < 128 else 8)
        torch.testing.assert_close(got, expected, **spike_tol(dtype))
    fp8 = cache.clamp(-448, 448).to(torch.float8_e4m3fn)  # an FP8 cache: its tiles come as float8, read as float16
    expected = paged_attention_ref(query, fp8, tables, seq_lens, starts, scale)
    got = bulk(query, fp8, tables, scale, block_m=launches[0][0], block_n=launches[0][1], num_warps=4)
    torch.testing.assert_close(got, expected, **spike_tol(dtype))
    # Heads narrower than a 16-wide tile (the test checkpoints' 8): the query tile is padded to 16 columns, which a
    # bulk copy of 8 cannot fill, so such a cache gathers rows whatever ``tma`` says.
    cache, tables, seq_lens, starts, query = prefill_case(cases, page, 4, 2, 8, dtype)
    assert not _tma_fits(cache[0], 16)
    got = bulk(query, cache, tables, 8**-0.5, block_m=16, block_n=16, num_warps=4)
    torch.testing.assert_close(got, paged_attention_ref(query, cache, tables, seq_lens, starts, 8**-0.5), **tol(dtype))


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] != 9, reason="Hopper's bulk copies and wgmma")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_prompts_take_the_gluon_kernel_and_match_the_reference(dtype):
    """Prompts of at least gluon_attention.MIN_QUERIES queries a sequence, on 64-token pages, go to the Gluon kernel:
    whole prompts and a chunk after a cached prefix, lengths off the tiles, NaN in the last pages' spare slots, keys
    of 400 times the others' size in a later page. Against the reference and the Triton kernel; then a padded
    launch (spare rows, sequences without queries), whose spare rows must be left as they were."""
    from raygrid.kernels import gluon_attention

    heads, kv_heads, head_dim, page = 16, 8, 128, 64
    cases = [(0, 5000), (1000, 4200), (77, 4097)]
    cache, tables, seq_lens, starts, query = prefill_case(cases, page, heads, kv_heads, head_dim, dtype)
    for row, n in enumerate(seq_lens):
        cache[:, tables[row, (n - 1) // page], (n - 1) % page + 1 :] = float("nan")
    cache[0, tables[1, 20], 8:12] *= 400
    lens, query_starts = (torch.tensor(v, dtype=torch.int32, device=DEVICE) for v in (seq_lens, starts))
    assert gluon_attention.fits(query, cache[0], len(cases))
    assert not gluon_attention.fits(query[:4096], cache[0], 2)  # 2,048 queries a sequence: the Triton kernel's
    scale = head_dim**-0.5
    close = tol(torch.bfloat16)  # both 16-bit types (float16 keeps more mantissa than bfloat16)
    expected = paged_attention_ref(query, cache, tables, seq_lens, starts, scale)
    got = paged_attention_prefill(query, cache, tables, lens, query_starts, scale)
    triton_kernel = paged_attention_prefill(query, cache, tables, lens, query_starts, scale, gluon=False)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, expected, **close)
    torch.testing.assert_close(got, triton_kernel, **close)
    # a padded launch: 19 spare rows, and 3 sequences without queries after the real ones
    spare = 19
    out = torch.full((query.shape[0] + spare, heads, head_dim), 7.0, dtype=dtype, device=DEVICE)
    padded_query = torch.cat([query, torch.randn(spare, heads, head_dim, dtype=dtype, device=DEVICE)])
    padded_tables = torch.cat([tables, torch.zeros(3, tables.shape[1], dtype=tables.dtype, device=DEVICE)])
    padded_lens = torch.cat([lens, torch.zeros(3, dtype=torch.int32, device=DEVICE)])
    padded_starts = torch.cat([query_starts, query_starts[-1:].repeat(3)])
    gluon_attention.paged_attention_prefill(padded_query, cache, padded_tables, padded_lens, padded_starts, scale, out)
    torch.testing.assert_close(out[: query.shape[0]], expected, **close)
    assert (out[query.shape[0] :] == 7.0).all()


def test_prefill_attention_on_a_padded_batch_as_a_cuda_graph_runs_it():
    """A graph of a step with prefill is captured for T tokens over R sequences and replays smaller steps: the
    rows past the real tokens belong to no sequence and keep what they held, the padding sequences (no
    queries, length 0) are skipped, and the real rows are exact. So is a batch whose first sequence starts
    past row 0 (a launch over the prompts of a batch whose decode rows come first)."""
    heads, kv_heads, head_dim, block_size = SHAPES[0]
    cases = [(0, 1), (30, 1), (0, 21), (9, 1), (5, 40)] if not ON_GPU else [(0, 1), (600, 1), (0, 512), (90, 1), (16, 300)]
    seq_lens = [c + q for c, q in cases]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    cache = make_cache(num_blocks, block_size, kv_heads, head_dim, torch.float32)
    tables = random_block_tables(seq_lens, block_size, num_blocks)
    starts = [0]
    for _, q in cases:
        starts.append(starts[-1] + q)
    n, pad_rows, pad_seqs = starts[-1], 19, 6
    query = torch.randn(n + pad_rows, heads, head_dim, device=DEVICE)
    scale = head_dim**-0.5
    expected = paged_attention_ref(query[:n], cache, tables, seq_lens, starts, scale)
    padded_tables = torch.cat([tables, torch.zeros(pad_seqs, tables.shape[1], dtype=tables.dtype, device=DEVICE)])
    lens = torch.tensor(seq_lens + [0] * pad_seqs, dtype=torch.int32, device=DEVICE)
    padded_starts = torch.tensor(starts + [n] * pad_seqs, dtype=torch.int32, device=DEVICE)
    for pack, block_m in ((1, 16), (2, 16), (2, 64)):
        out = torch.full_like(query, 7.0)
        paged_attention_prefill(query, cache, padded_tables, lens, padded_starts, scale, out=out, block_m=block_m, block_n=16, pack=pack)
        torch.testing.assert_close(out[:n], expected, **tol(torch.float32))
        assert torch.all(out[n:] == 7.0)
    out = torch.full_like(query, 7.0)
    first = starts[3]  # past a whole tile of rows
    paged_attention_prefill(query, cache, tables[3:], lens[3 : len(cases)], padded_starts[3 : len(cases) + 1], scale, out=out,
                            block_m=16, block_n=16, pack=2)
    torch.testing.assert_close(out[first:n], expected[first:], **tol(torch.float32))
    assert torch.all(out[:first] == 7.0) and torch.all(out[n:] == 7.0)


def test_kernel_launch_overrides_from_the_environment_name_only_known_settings(monkeypatch):
    """RAYGRID_DECODE_CONFIG and its twins lay a JSON object over the launch's defaults; a key the defaults lack is
    refused by name, not kept beside them unread."""
    from raygrid.kernels.triton_attention import overridden

    defaults = dict(block_n=64, num_warps=4)
    monkeypatch.setenv("RAYGRID_TEST_CONFIG", '{"num_warps": 2}')
    assert overridden(defaults, "RAYGRID_TEST_CONFIG") == dict(block_n=64, num_warps=2)
    assert defaults == dict(block_n=64, num_warps=4)
    monkeypatch.setenv("RAYGRID_TEST_CONFIG", '{"num_warps": 2, "fp8_num_warps": 1}')
    with pytest.raises(ValueError, match=r"RAYGRID_TEST_CONFIG: unknown keys \['fp8_num_warps'\]"):
        overridden(defaults, "RAYGRID_TEST_CONFIG")
    monkeypatch.delenv("RAYGRID_TEST_CONFIG")
    assert overridden(defaults, "RAYGRID_TEST_CONFIG") == defaults


def test_prefill_launch_takes_short_tiles_when_sequences_bring_few_queries():
    """A mixed step (256 decode rows beside two 512-token prompts) takes the 16-row tiles; prompts take the 128-row ones."""
    from raygrid.kernels.triton_attention import PREFILL_CONFIG, PREFILL_SHORT_CONFIG, prefill_launch

    assert prefill_launch(256 + 2 * 512, 258) is PREFILL_SHORT_CONFIG
    assert prefill_launch(16 * 512, 16) is PREFILL_CONFIG
    assert prefill_launch(2048, 1) is PREFILL_CONFIG
    # A launch given 16-row tiles keeps them whole, whatever the chosen launch's subtiles (halves need 16 rows each).
    cache, tables, seq_lens, starts, query = prefill_case([(0, 128)], 16, 4, 2, 16, torch.float32)
    lens, query_starts = (torch.tensor(v, dtype=torch.int32, device=DEVICE) for v in (seq_lens, starts))
    assert prefill_launch(128, 1) is PREFILL_CONFIG and PREFILL_CONFIG["subtiles"] == 2
    got = paged_attention_prefill(query, cache, tables, lens, query_starts, 0.25, block_m=16, block_n=16)
    torch.testing.assert_close(got, paged_attention_ref(query, cache, tables, seq_lens, starts, 0.25), **tol(torch.float32))
    assert PREFILL_SHORT_CONFIG["block_m"] < PREFILL_CONFIG["block_m"]


def test_a_step_with_many_prompt_tokens_takes_the_long_tiles_however_many_decode_rows_beside_them(monkeypatch):
    """Where the host knows the batch's lengths, the tiles are those whose key reads cost less (``prefill_launch_for``):
    W1's steps with prompt tokens (about 14 prompts of 560 tokens beside their decode rows, 8,192 tokens) keep the
    128-row tiles past 128 sequences, where the shapes' rule turned to 16-row tiles; #11's steady step (256 decode rows,
    two 512-token prompts) keeps the 16-row ones, as do a few decode rows with a short prompt chunk. The key reads
    are counted as a loop over every tile would; the shapes' rule comes back with RAYGRID_PREFILL_TILE_CHOICE."""
    import itertools

    from raygrid.kernels import triton_attention
    from raygrid.kernels.triton_attention import PREFILL_CONFIG, PREFILL_SHORT_CONFIG, prefill_launch, prefill_launch_for, tile_key_reads

    def batch(decodes: int, context: int, prompts: int, prompt_len: int, cached: int = 0):
        query_lens = [1] * decodes + [prompt_len] * prompts
        return [0, *itertools.accumulate(query_lens)], [context] * decodes + [cached + prompt_len] * prompts

    rng = np.random.default_rng(0)
    for _ in range(50):
        q = rng.integers(0, 300, size=int(rng.integers(1, 8)))
        s = q + rng.integers(0, 500, size=q.size)
        per_tile = int(rng.choice([1, 8, 64]))
        brute = sum(prefix + min(n, (t + 1) * per_tile) for n, prefix in zip(q.tolist(), (s - q).tolist())
                    for t in range(-(-n // per_tile)))
        assert tile_key_reads(q, s, per_tile) == brute
    for decodes in (16, 64, 115, 129, 192, 249):
        w1_step = batch(decodes, 700, 14, 560)
        assert prefill_launch_for(*w1_step) is PREFILL_CONFIG, decodes
    assert prefill_launch(8192, 129) is PREFILL_SHORT_CONFIG  # the shapes' rule at the same step
    assert prefill_launch_for(*batch(256, 640, 2, 512)) is PREFILL_SHORT_CONFIG
    assert prefill_launch_for(*batch(200, 900, 1, 64, cached=2000)) is PREFILL_SHORT_CONFIG  # a later chunk's few queries
    assert prefill_launch_for(*batch(0, 0, 1, 8192)) is PREFILL_CONFIG and prefill_launch_for(*batch(0, 0, 16, 512)) is PREFILL_CONFIG
    monkeypatch.setitem(triton_attention.PREFILL_TILE_CHOICE, "rule", "shape")  # as RAYGRID_PREFILL_TILE_CHOICE sets it
    assert prefill_launch_for(*batch(129, 700, 14, 560)) is PREFILL_SHORT_CONFIG


def test_a_step_with_prompt_tokens_gives_its_leading_decode_rows_to_the_decode_kernel(monkeypatch):
    """``prompt_launch_for``: W1's steps with prompt tokens from 64 decode rows on split (those rows by the decode
    kernel, the prompts by the long tiles); 16 decode rows stay in the prompts' launch; only the rows before the first
    prompt count (a decode row after it, a later chunk of one query included, stays with the prefill kernel); a batch
    of decode rows alone is not split; split_decode_rows 0 never splits."""
    import itertools

    from raygrid.kernels import triton_attention
    from raygrid.kernels.triton_attention import PREFILL_CONFIG, PREFILL_SHORT_CONFIG, prompt_launch_for

    def batch(query_lens, contexts):
        return [0, *itertools.accumulate(query_lens)], contexts

    for decodes in (64, 129, 249):
        launch = prompt_launch_for(*batch([1] * decodes + [560] * 14, [700] * decodes + [560] * 14))
        assert launch.decode_rows == decodes and launch.tiles is PREFILL_CONFIG, decodes
    assert prompt_launch_for(*batch([1] * 16 + [560] * 14, [700] * 16 + [560] * 14)) == (0, PREFILL_CONFIG)
    # 256 decode rows beside four 512-token prompts: one launch would take the short tiles; the prompts alone, the long
    steady = batch([1] * 256 + [512] * 4, [640] * 256 + [512] * 4)
    assert triton_attention.prefill_launch_for(*steady) is PREFILL_SHORT_CONFIG
    assert prompt_launch_for(*steady) == (256, PREFILL_CONFIG)
    # 100 decode rows, a prompt, 100 more: the first 100 split; the prompt's launch keeps the rest (short tiles)
    mixed = prompt_launch_for(*batch([1] * 100 + [512] + [1] * 100, [700] * 100 + [512] + [700] * 100))
    assert mixed == (100, PREFILL_SHORT_CONFIG)
    assert prompt_launch_for(*batch([1] * 300, [700] * 300)).decode_rows == 0
    assert prompt_launch_for(*batch([512] + [1] * 200, [512] + [700] * 200)).decode_rows == 0
    monkeypatch.setitem(triton_attention.PREFILL_TILE_CHOICE, "split_decode_rows", 0)
    assert prompt_launch_for(*batch([1] * 129 + [560] * 14, [700] * 129 + [560] * 14)).decode_rows == 0
    # RAYGRID_PREFILL_TILE_CHOICE's values are checked by name (a misspelt rule would pass as "cost")
    triton_attention.check_tile_choice(triton_attention.PREFILL_TILE_CHOICE)
    for bad, field in (({"rule": "costs"}, "rule"), ({"split_decode_rows": -1}, "split_decode_rows"),
                       ({"long_tile_cost": 0}, "long_tile_cost")):
        with pytest.raises(ValueError, match=field):
            triton_attention.check_tile_choice({**triton_attention.PREFILL_TILE_CHOICE, **bad})


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_attention_of_a_step_with_decode_rows_first_matches_the_reference(dtype, monkeypatch):
    """``paged_attention_split``: the leading decode rows by the decode kernel, the prompts (a cached prefix, a fresh
    one, a one-query chunk after them) by the prefill kernel into the same output, equal to the reference; rows the
    prefill kernel's grid covers before its first sequence are left to the decode kernel's values. Then the engine's
    path: ``ops.paged_attention`` with the step's ``prompt_launch_for`` (on the CPU told to take the Triton kernels,
    which the interpreter runs, and to split from the 5 decode rows there), those rows started longest first."""
    from raygrid.kernels import ops, triton_attention
    from raygrid.kernels.triton_attention import paged_attention_split, prompt_launch_for
    from raygrid.models.layers.attention import AttentionMetadata

    heads, kv_heads, head_dim, page = (4, 2, 16, 8) if not ON_GPU else (16, 8, 128, 64)
    decodes, prompts = (5, [(20, 9), (0, 13), (33, 1)]) if not ON_GPU else (80, [(300, 700), (0, 560), (1000, 1)])
    cases = [(int(c), 1) for c in torch.randint(1, 90 if not ON_GPU else 1500, (decodes,))] + prompts
    cache, tables, seq_lens, starts, query = prefill_case(cases, page, heads, kv_heads, head_dim, dtype)
    lens, query_starts = (torch.tensor(v, dtype=torch.int32, device=DEVICE) for v in (seq_lens, starts))
    scale = head_dim**-0.5
    expected = paged_attention_ref(query, cache, tables, seq_lens, starts, scale)
    out = torch.full_like(query, float("nan"))
    got = paged_attention_split(query, cache, tables, lens, query_starts, scale, decodes, out=out)
    assert got is out
    torch.testing.assert_close(got, expected, **tol(dtype))
    if not ON_GPU:
        monkeypatch.setattr(ops, "use_triton", lambda t: True)
        monkeypatch.setitem(triton_attention.PREFILL_TILE_CHOICE, "split_decode_rows", decodes)
    launch = prompt_launch_for(starts, seq_lens)
    assert launch.decode_rows == decodes
    meta = AttentionMetadata(slot_mapping=None, block_tables=tables, seq_lens=seq_lens, query_start_loc=starts,
                             max_query_len=max(q for _, q in cases), seq_lens_tensor=lens,
                             query_start_loc_tensor=query_starts, prompt_launch=launch,
                             decode_order=torch.argsort(-lens[:decodes], stable=True).to(torch.int32))  # as staged
    splits = []  # the decode rows of each split launch ops makes
    monkeypatch.setattr(triton_attention, "paged_attention_split",
                        lambda *a, **k: splits.append(a[6]) or paged_attention_split(*a, **k))
    torch.testing.assert_close(ops.paged_attention(query, cache, meta, scale), expected, **tol(dtype))
    assert splits == [decodes]


def test_a_decode_launch_of_any_size_launches_as_the_graph_it_would_pad_to():
    """Eager decode launches (a step's leading decode rows, ``paged_attention_split``) come in any size, and the
    number of context slices is a constexpr of the kernel, as are the keys a step over an FP8 cache (with its warps):
    each size must launch as the decode graph it would pad to, whose variant the engine's start compiled. Over SM
    counts, kv heads a GPU and largest batches."""
    from raygrid.engine.cuda_graphs import capture_sizes
    from raygrid.kernels.triton_attention import fp8_launch_on, splits_on

    def launch(sms, rows, kv_heads):
        splits = splits_on(sms, rows, kv_heads)
        return splits, fp8_launch_on(sms, rows, kv_heads, splits)

    for sms, kv_heads, max_batch in [(132, 1, 256), (132, 2, 100), (132, 8, 300), (148, 1, 200), (78, 1, 37)]:
        sizes = capture_sizes(max_batch)
        for rows in range(1, max_batch + 1):
            graph = next(s for s in sizes if s >= rows)
            assert launch(sms, rows, kv_heads) == launch(sms, graph, kv_heads), (sms, kv_heads, rows, graph)
    assert [splits_on(132, rows, 1) for rows in (1, 8, 64, 66, 80, 132)] == [64, 50, 7, 5, 5, 1]
    # 8 kv heads: 128 keys and 4 warps below 6 programs an SM, 64 and 2 below 10, then 32 and 1
    assert [fp8_launch_on(132, rows, 8, 1) for rows in (96, 97, 112, 165, 176)] == [(128, 4), (64, 2), (64, 2), (32, 1), (32, 1)]


def test_gluon_prefill_takes_long_16bit_prompts_on_pages_of_whole_tiles():
    """Which launches the Gluon prompt kernel takes (its shape rules; on a GPU ``fits`` also asks for Hopper):
    16-bit queries and cache of one dtype, head_dim 128, an even query-head group, pages of whole 64-key tiles, and
    at least MIN_QUERIES queries a sequence on average."""
    from raygrid.kernels import gluon_attention

    n = gluon_attention.MIN_QUERIES

    def takes(tokens=2 * n, seqs=2, heads=16, kv_heads=8, dim=128, page=64, dtype=torch.bfloat16, cache_dtype=None):
        query = torch.empty(tokens, heads, dim, dtype=dtype)
        cache = torch.empty(3, page, kv_heads, dim, dtype=cache_dtype or dtype)
        return gluon_attention.takes(query, cache, seqs)

    assert takes() and takes(dtype=torch.float16) and takes(tokens=n, seqs=1) and takes(heads=32, kv_heads=8)
    assert not takes(tokens=2 * n - 1)  # fewer than MIN_QUERIES queries a sequence: the Triton kernel's
    assert not takes(dtype=torch.float32) and not takes(cache_dtype=torch.float8_e4m3fn)
    assert not takes(page=16) and not takes(page=96) and not takes(dim=64) and not takes(heads=8)  # a group of 1
    assert not gluon_attention.fits(torch.empty(2 * n, 16, 128, dtype=torch.bfloat16),
                                    torch.empty(3, 64, 8, 128, dtype=torch.bfloat16), 2)  # not on a GPU


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_kv_cache_store_decode_and_prefill(dtype):
    """A float8 e4m3 KV cache (kv_cache_dtype="fp8"): stored bit for bit as the reference stores it (rounded to
    nearest, saturated at +-448: keys of 1000 and -600 included), then read by decode and prefill attention into
    the query's dtype as the reference reads it."""
    heads, kv_heads, head_dim, block_size = SHAPES[0]
    fp8 = torch.float8_e4m3fn
    seq_lens = [1, 7, 33, 64, 5] if not ON_GPU else [1, 17, 300, 1024, 2000, 77]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 4
    cache = (make_cache(num_blocks, block_size, kv_heads, head_dim, torch.float32) * 3).to(fp8)
    tokens = 20
    key = torch.randn(tokens, kv_heads, head_dim, device=DEVICE).to(dtype) * 50
    value = torch.randn(tokens, kv_heads, head_dim, device=DEVICE).to(dtype)
    key[0, 0, :2] = torch.tensor([1000.0, -600.0])
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:tokens]
    slots[3] = -1  # padding
    stored = cache.clone()
    store_kv(key, value, stored, slots)
    expected_store = cache.clone()
    store_kv_ref(key, value, expected_store, slots)
    assert torch.equal(stored.view(torch.uint8), expected_store.view(torch.uint8))
    assert stored[0].view(-1, kv_heads, head_dim)[slots[0], 0, :2].float().tolist() == [448.0, -448.0]

    tables = random_block_tables(seq_lens, block_size, num_blocks)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    scale = head_dim**-0.5
    query = torch.randn(len(seq_lens), heads, head_dim, dtype=dtype, device=DEVICE)
    expected = paged_attention_ref(query, stored, tables, seq_lens, list(range(len(seq_lens) + 1)), scale)
    # Keys of magnitude 50 to 448 make scores of hundreds: on the GPU 11 of 94,208 float32 outputs went over 2e-5.
    close = spike_tol(dtype)
    got = paged_attention_decode(query, stored, tables, lens, scale, block_n=16, num_splits=3, min_split_tokens=16)
    torch.testing.assert_close(got, expected, **close)
    torch.testing.assert_close(paged_attention_decode(query, stored, tables, lens, scale), expected, **close)  # the engine's launch
    # and its launches for fuller batches (DECODE_CONFIG["fp8_medium_from"], ["fp8_narrow_from"]), longest first
    for block_n, warps in ((64, 2), (32, 1)):
        narrow = paged_attention_decode(query, stored, tables, lens, scale, block_n=block_n, num_warps=warps, num_splits=1,
                                        order=torch.argsort(lens, descending=True).int())
        torch.testing.assert_close(narrow, expected, **close)
    new = [min(n, 9) for n in seq_lens]  # the last tokens of each sequence, after a cached prefix
    starts = [0]
    for n in new:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], heads, head_dim, dtype=dtype, device=DEVICE)
    expected = paged_attention_ref(query, stored, tables, seq_lens, starts, scale)
    got = paged_attention_prefill(query, stored, tables, lens, torch.tensor(starts, dtype=torch.int32, device=DEVICE),
                                  scale, block_m=16, block_n=16)
    torch.testing.assert_close(got, expected, **close)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm(dtype, with_residual):
    hidden = 64 if not ON_GPU else 1024
    x = torch.randn(13, hidden, dtype=dtype, device=DEVICE)
    w = torch.randn(hidden, dtype=dtype, device=DEVICE)
    if with_residual:
        r = torch.randn_like(x)
        out, res = rms_norm(x, w, 1e-6, r)
        torch.testing.assert_close(res, x + r)
        torch.testing.assert_close(out, rms_norm_ref(x + r, w, 1e-6), **tol(dtype))
    else:
        torch.testing.assert_close(rms_norm(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_on_a_strided_view(dtype):
    heads, head_dim = (4, 16) if not ON_GPU else (16, 128)
    qkv = torch.randn(9, heads * head_dim * 2, dtype=dtype, device=DEVICE)
    q = qkv[:, : heads * head_dim].view(9, heads, head_dim)  # rows strided by the qkv width
    w = torch.randn(head_dim, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(rms_norm(q, w, 1e-6), rms_norm_ref(q, w, 1e-6), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary(dtype):
    heads, kv_heads, head_dim = (4, 2, 16) if not ON_GPU else (16, 8, 128)
    positions = torch.randint(0, 500, (11,), device=DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=DEVICE) / head_dim))
    freqs = torch.arange(512, dtype=torch.float32, device=DEVICE)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    qkv = torch.randn(11, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=DEVICE)
    q = qkv[:, : heads * head_dim].view(11, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(11, kv_heads, head_dim)
    c, s = cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    expected_q, expected_k = apply_rotary_ref(q, c, s), apply_rotary_ref(k, c, s)
    rotary_inplace(positions, q, k, cos, sin)
    torch.testing.assert_close(q, expected_q, **tol(dtype))
    torch.testing.assert_close(k, expected_k, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rotary(dtype):
    """The fused kernel equals the two references one after the other, on views of a qkv output."""
    heads, kv_heads, head_dim = (4, 2, 16) if not ON_GPU else (16, 8, 128)
    tokens = 11 if not ON_GPU else 256
    positions = torch.randint(0, 500, (tokens,), device=DEVICE)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=DEVICE) / head_dim))
    freqs = torch.arange(512, dtype=torch.float32, device=DEVICE)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype, device=DEVICE) * 3
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    q_weight = torch.rand(head_dim, dtype=dtype, device=DEVICE) + 0.5
    k_weight = torch.rand(head_dim, dtype=dtype, device=DEVICE) + 0.5
    c, s = cos[positions].to(dtype).unsqueeze(1), sin[positions].to(dtype).unsqueeze(1)
    expected_q = apply_rotary_ref(rms_norm_ref(q, q_weight, 1e-6), c, s)
    expected_k = apply_rotary_ref(rms_norm_ref(k, k_weight, 1e-6), c, s)
    before = qkv.clone()
    got_q, got_k = qk_norm_rotary(positions, q, k, q_weight, k_weight, 1e-6, cos, sin)
    torch.testing.assert_close(got_q, expected_q, **tol(dtype))
    torch.testing.assert_close(got_k, expected_k, **tol(dtype))
    assert torch.equal(qkv, before)  # the inputs are left as they were


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    n = 48 if not ON_GPU else 3072
    x = torch.randn(7, 2 * n, dtype=dtype, device=DEVICE)
    torch.testing.assert_close(silu_and_mul(x), silu_and_mul_ref(x), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_argmax(dtype):
    # GPU: a decode batch over Qwen3's vocabulary; CPU: small, with blocks small enough for several chunks.
    torch.manual_seed(0)
    rows, vocab, sizes = (256, 151936, {}) if ON_GPU else (6, 3000, dict(block=256, chunk=1024))
    logits = (torch.randn(rows, vocab, device=DEVICE) * 4).to(dtype)
    temperature = torch.rand(rows, device=DEVICE) * 1.5 + 0.1
    temperature[::3] = 0.0  # greedy rows
    seeds = torch.randint(0, 2**62, (rows,), device=DEVICE)
    got = gumbel_argmax(logits, temperature, seeds, **sizes)
    uniform = philox_uniform(seeds, vocab, **({"block": 256} if sizes else {}))
    # float32 in the kernel against float64 here: a token other than the reference's must be a near tie.
    scores = gumbel_scores(logits, temperature, uniform)
    best = scores.max(dim=1).values
    shortfall = best - scores.gather(1, got.unsqueeze(1)).squeeze(1)
    assert (shortfall <= 1e-4 * (1 + best.abs())).all(), shortfall.max()
    assert (got == scores.argmax(dim=1)).sum() >= rows - 2
    # The noise itself: uniform in [0, 1), and the four columns one Philox call fills are not alike.
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean().item() - 0.5) < 0.01
    assert torch.unique(uniform[0]).numel() > 0.99 * vocab
    assert torch.equal(got[::3], logits[::3].float().argmax(dim=-1))
    # The noise does something: 32 seeds over one near-flat row draw many different tokens.
    flat_row = torch.randn(1, vocab, device=DEVICE).to(dtype).expand(32, -1).contiguous()
    draws = gumbel_argmax(flat_row, torch.ones(32, device=DEVICE), seeds[:1] + torch.arange(32, device=DEVICE), **sizes)
    assert torch.unique(draws).numel() > 16
    # Same seeds, same tokens; ties go to the lowest id, as torch.argmax.
    assert torch.equal(gumbel_argmax(logits, temperature, seeds, **sizes), got)
    flat = torch.zeros(2, vocab, dtype=dtype, device=DEVICE)
    flat[:, [7, vocab - 5]] = 1.0
    assert gumbel_argmax(flat, torch.zeros(2, device=DEVICE), seeds[:2], **sizes).tolist() == [7, 7]
    chunk = sizes.get("chunk", 8192)  # a tie between two chunks past the first: the earlier chunk's id
    flat.zero_()
    flat[:, [chunk + 3, 2 * chunk + 5]] = 1.0
    tokens = gumbel_argmax(flat, torch.zeros(2, device=DEVICE), seeds[:2], **sizes)
    assert tokens.dtype == torch.int64 and tokens.tolist() == [chunk + 3] * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_token_bitmask(dtype):
    # Some rows of the batch sample under a grammar, in another order than the mask's rows; the vocabulary is
    # not a multiple of 32; a mask narrower than the vocabulary refuses the tokens past it.
    torch.manual_seed(0)
    batch, vocab = (256, 151936) if ON_GPU else (7, 1000)
    words = (vocab + 31) // 32
    logits = torch.randn(batch, vocab, device=DEVICE).to(dtype)
    bitmask = torch.randint(-2**31, 2**31 - 1, (5, words), dtype=torch.int32, device=DEVICE)
    bitmask[1] = -1  # allows everything
    bitmask[3] = 0  # allows nothing
    bitmask[4, words // 2:] = 0
    rows = torch.tensor([6, 0, 3, 2, 5], device=DEVICE)
    mask_rows = torch.tensor([2, 4, 0, 1, 3], device=DEVICE)
    expected = logits.clone()
    apply_token_bitmask_ref(expected, bitmask, rows, mask_rows)
    got = logits.clone()
    apply_token_bitmask(got, bitmask, rows, mask_rows)
    assert torch.equal(got, expected)
    assert torch.equal(got[[1, 4]], logits[[1, 4]]) and torch.equal(got[2], logits[2])  # untouched rows, and the all-ones mask
    assert torch.isinf(got[5]).all() and 0.4 < torch.isinf(got[6]).float().mean() < 0.6
    # Bit t % 32 of word t // 32: token 33 is word 1's bit 1.
    one = torch.zeros(1, words, dtype=torch.int32, device=DEVICE)
    one[0, 1] = 2
    single = logits[:1].clone()
    apply_token_bitmask(single, one, torch.tensor([0], device=DEVICE), torch.tensor([0], device=DEVICE))
    assert torch.isfinite(single[0]).nonzero().flatten().tolist() == [33]
    narrow = logits[:1].clone()
    apply_token_bitmask(narrow, bitmask[1:2, :-2].contiguous(), torch.tensor([0], device=DEVICE), torch.tensor([0], device=DEVICE))
    assert torch.isfinite(narrow[0]).nonzero().flatten().tolist() == list(range(32 * (words - 2)))


def random_penalties(batch: int, vocab: int) -> Penalties:
    """Rows read their slot's statistics in another order than the slots'; two rows share no slot; row 1 has no
    penalties (the empty slot, whose statistics are zeros), row 2 repetition alone."""
    counts = torch.randint(0, 4, (batch + 1, vocab), device=DEVICE).float() * (torch.rand(batch + 1, vocab, device=DEVICE) < 0.05)
    in_prompt = torch.rand(batch + 1, vocab, device=DEVICE) < 0.05
    counts[-1], in_prompt[-1] = 0, False
    slots = torch.randperm(batch, device=DEVICE)
    slots[1] = batch
    repetition = torch.rand(batch, device=DEVICE) + 0.5
    frequency = torch.rand(batch, device=DEVICE) - 0.5
    presence = torch.rand(batch, device=DEVICE) - 0.5
    repetition[1], frequency[1], presence[1] = 1.0, 0.0, 0.0
    frequency[2], presence[2] = 0.0, 0.0
    return Penalties(counts, in_prompt, slots, repetition, frequency, presence)


def test_apply_penalties():
    # The vocabulary is not a multiple of the block.
    torch.manual_seed(0)
    batch, vocab, block = (256, 151936, 2048) if ON_GPU else (6, 1000, 128)
    logits = torch.randn(batch, vocab, device=DEVICE) * 4
    penalties = random_penalties(batch, vocab)
    expected = apply_penalties_ref(logits.clone(), penalties)
    got = apply_penalties(logits.clone(), penalties, block=block)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert torch.equal(got[1], logits[1]) and not torch.equal(got[0], logits[0])
    seen = (penalties.counts[penalties.slots[2]] > 0) | penalties.in_prompt[penalties.slots[2]]
    rep = penalties.repetition[2]
    torch.testing.assert_close(got[2], torch.where(seen, torch.where(logits[2] > 0, logits[2] / rep, logits[2] * rep), logits[2]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_argmax_applies_penalties_as_it_reads(dtype):
    """The draw with the penalties in its pass against the draw from logits penalized beforehand (float32, in place):
    the same tokens, greedy rows and sampled ones, with and without penalties, over several chunks."""
    torch.manual_seed(1)
    rows, vocab, sizes = (256, 151936, {}) if ON_GPU else (6, 3000, dict(block=256, chunk=1024))
    logits = (torch.randn(rows, vocab, device=DEVICE) * 4).to(dtype)
    temperature = torch.rand(rows, device=DEVICE) * 1.5 + 0.1
    temperature[::3] = 0.0  # greedy rows, row 0 among them
    seeds = torch.randint(0, 2**62, (rows,), device=DEVICE)
    penalties = random_penalties(rows, vocab)
    # Row 0's best logit is a token its slot saw: the penalties must move its greedy pick.
    top = logits[0].float().argmax()
    penalties.in_prompt[penalties.slots[0], top] = True
    penalties.repetition[0] = 100.0
    penalized = apply_penalties_ref(logits.to(torch.float32, copy=True), penalties)
    got = gumbel_argmax(logits, temperature, seeds, penalties, **sizes)
    before = gumbel_argmax(penalized, temperature, seeds, **sizes)
    assert (got == before).sum() >= rows - 2  # on a GPU the two may round a near tie apart
    # Greedy rows: the best penalized logit, up to float32's rounding of the division (Triton's against torch's).
    best = penalized[::3].max(dim=-1).values
    assert (penalized[::3].gather(1, got[::3, None]).squeeze(1) >= best - 1e-5 * (1 + best.abs())).all() and got[0] != top
    assert torch.equal(got[1], gumbel_argmax(logits[1:2], temperature[1:2], seeds[1:2], **sizes)[0])  # the row without any
    assert not torch.equal(got, gumbel_argmax(logits, temperature, seeds, **sizes))


@pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")  # the interpreter's log(0), row 4
@pytest.mark.parametrize("dtype", DTYPES)
def test_logprob_stats(dtype):
    """Log-sum-exp, the token's logit and its rank, in one pass over the logits in their dtype, against torch's: rows
    with -inf logits (grammar masks, bans) and one whose lanes mostly see only -inf, a token tied with others, and a
    vocabulary that is not a multiple of the block."""
    torch.manual_seed(2)
    rows, vocab, sizes = (256, 151936, {}) if ON_GPU else (6, 1000, dict(block=128))
    logits = (torch.randn(rows, vocab, device=DEVICE) * 5).to(dtype)
    logits[1, ::3] = float("-inf")
    logits[2, 10:] = float("-inf")  # ten finite logits: most lanes never see a finite one
    logits[3, :50] = logits[3, 7]  # the token's logit shared by 49 others, which do not count as above it
    logits[4] = float("-inf")  # nothing allowed at all: -inf, as torch gives
    tokens = torch.randint(0, vocab, (rows,), device=DEVICE)
    tokens[2], tokens[3] = 4, 7
    lse, token_logits, ranks = logprob_stats(logits, tokens, **sizes)
    want_lse, want_logits, want_ranks = logprob_stats_ref(logits, tokens)
    torch.testing.assert_close(lse, want_lse, atol=1e-4, rtol=1e-5)
    assert torch.equal(token_logits, want_logits) and torch.equal(ranks, want_ranks)
    assert lse.dtype == torch.float32 and ranks.dtype == torch.int64
    assert lse[4] == float("-inf") and torch.isfinite(lse[:4]).all() and torch.isfinite(lse[5:]).all()
    top = logits.float().argmax(dim=-1)
    assert logprob_stats(logits, top, **sizes)[2].tolist() == [1] * rows  # the best token ranks first
    # and the reference is what a log-softmax gives: a token's logprob is its logit minus the log-sum-exp
    torch.testing.assert_close(want_logits - want_lse, torch.log_softmax(logits.float(), -1).gather(1, tokens[:, None]).squeeze(1),
                               equal_nan=True)


# (experts, top-k, tokens, hidden, intermediate): real sizes on a GPU, tiny ones interpreted on CPU.
MOE_SHAPES = [(128, 8, 300, 2048, 768), (8, 2, 1, 4096, 1792), (64, 4, 33, 1024, 512)] if ON_GPU else [
    (8, 2, 5, 32, 16), (4, 4, 3, 24, 40), (16, 1, 9, 16, 16), (8, 2, 1, 16, 24)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", MOE_SHAPES, ids=lambda s: "E{}k{}T{}".format(*s[:3]))
def test_fused_moe_matches_reference(shape, dtype):
    num_experts, top_k, tokens, hidden, inter = shape
    torch.manual_seed(0)
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) / hidden**0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, device=DEVICE) / inter**0.5).to(dtype)
    weights, ids = route_ref(torch.randn(tokens, num_experts, device=DEVICE, dtype=dtype), top_k, renormalize=True)
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids), fused_moe_ref(x, w13, w2, weights, ids), **tol(dtype))


def test_fused_moe_with_crowded_and_idle_experts():
    """Every token routed to the same two experts (one expert's run spans several blocks), the other
    experts idle."""
    torch.manual_seed(1)
    tokens, hidden, inter, num_experts = 37, 32, 16, 6
    x = torch.randn(tokens, hidden, device=DEVICE)
    w13, w2 = torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) * 0.2, torch.randn(num_experts, hidden, inter, device=DEVICE) * 0.2
    ids = torch.tensor([[4, 1]] * tokens, device=DEVICE)
    weights = torch.softmax(torch.randn(tokens, 2, device=DEVICE), dim=-1)
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids), fused_moe_ref(x, w13, w2, weights, ids), **tol(torch.float32))


def test_fused_moe_skips_experts_held_elsewhere():
    """Expert parallelism: a rank holds 3 of the experts as slots 0-2 and id 3 marks a pair another rank serves.
    Those pairs add nothing: the result is the reference's over the local pairs alone (their weights zeroed)."""
    torch.manual_seed(2)
    tokens, hidden, inter, slots = 29, 32, 16, 3
    x = torch.randn(tokens, hidden, device=DEVICE)
    w13, w2 = torch.randn(slots, 2 * inter, hidden, device=DEVICE) * 0.2, torch.randn(slots, hidden, inter, device=DEVICE) * 0.2
    ids = torch.randint(0, slots + 1, (tokens, 2), device=DEVICE)
    weights = torch.softmax(torch.randn(tokens, 2, device=DEVICE), dim=-1)
    local_only = fused_moe_ref(x, w13, w2, torch.where(ids < slots, weights, 0.0), torch.where(ids < slots, ids, 0))
    torch.testing.assert_close(fused_moe_ref(x, w13, w2, weights, ids), local_only, **tol(torch.float32))
    torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids, experts_elsewhere=True), local_only, **tol(torch.float32))


def runs_by_expert(pairs, block_expert, block_m):
    """Each expert's pair indices, sorted: the kernel may order the pairs of an expert's run freely,
    across the run's blocks too."""
    runs = {}
    for block, expert in enumerate(block_expert.tolist()):
        runs.setdefault(expert, []).extend(pairs[block * block_m : (block + 1) * block_m].tolist())
    return {expert: sorted(run) for expert, run in runs.items()}


def test_align_by_expert_pads_each_expert_to_the_block():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]], device=DEVICE)
    pairs, block_expert, num_padded = align_by_expert(ids, num_experts=5, block_m=4)
    assert num_padded.item() == 12  # experts 0, 2, 3 with 2, 3, 1 pairs: one block of 4 each
    assert pairs.numel() == 6 + 5 * 3  # the shape depends on T, k and E only
    runs = runs_by_expert(pairs, block_expert, 4)
    assert [runs[0], runs[2], runs[3]] == [[1, 4, 6, 6], [0, 2, 5, 6], [3, 6, 6, 6]]  # t*k+slot; 6 = T*k pads
    assert block_expert.tolist()[:3] == [0, 2, 3] and set(block_expert.tolist()[3:]) == {5}


@pytest.mark.parametrize("num_experts,top_k,tokens,block_m", [(128, 8, 300, 16), (7, 3, 200, 64), (16, 2, 1, 16)])
def test_align_by_expert_matches_reference(num_experts, top_k, tokens, block_m):
    """Pairs past one program's chunk (256), an expert count that is a power of two and one that is not."""
    torch.manual_seed(3)
    ids = torch.stack([torch.randperm(num_experts, device=DEVICE)[:top_k] for _ in range(tokens)])
    ids[: tokens // 3] = ids[0]  # a crowded expert set next to idle ones
    got, want = align_by_expert(ids, num_experts, block_m), align_by_expert_ref(ids, num_experts, block_m)
    assert got[2].tolist() == want[2].tolist() and torch.equal(got[1], want[1])
    assert runs_by_expert(got[0], got[1], block_m) == runs_by_expert(want[0], want[1], block_m)


def test_fused_moe_under_each_tile_configuration():
    """Every row of the tile table (big blocks, L2 grouping) on a batch that spans several row blocks."""
    torch.manual_seed(4)
    tokens, hidden, inter, num_experts, top_k = 70, 160, 100, 4, 2  # two column tiles, a partial group
    x = torch.randn(tokens, hidden, device=DEVICE)
    w13, w2 = torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) * 0.2, torch.randn(num_experts, hidden, inter, device=DEVICE) * 0.2
    weights, ids = route_ref(torch.randn(tokens, num_experts, device=DEVICE), top_k, renormalize=True)
    want = fused_moe_ref(x, w13, w2, weights, ids)
    for _, gate_up, down in TILES:
        torch.testing.assert_close(fused_moe(x, w13, w2, weights, ids, tiles=(gate_up, down)), want, **tol(torch.float32))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU: run on the device machine")
def test_fused_moe_replays_in_a_cuda_graph_with_new_routing():
    """Captured once, replayed with other hidden states and other routing: the shapes depend on the batch only."""
    torch.manual_seed(2)
    tokens, hidden, inter, num_experts, top_k = 64, 1024, 512, 32, 4
    w13 = (torch.randn(num_experts, 2 * inter, hidden, device=DEVICE) / hidden**0.5).bfloat16()
    w2 = (torch.randn(num_experts, hidden, inter, device=DEVICE) / inter**0.5).bfloat16()
    x = torch.randn(tokens, hidden, device=DEVICE, dtype=torch.bfloat16)
    logits = torch.randn(tokens, num_experts, device=DEVICE, dtype=torch.bfloat16)
    for _ in range(2):  # warm up (compile) outside the graph
        fused_moe(x, w13, w2, *route_ref(logits, top_k, True))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, *route_ref(logits, top_k, True))
    for seed in range(3):
        torch.manual_seed(10 + seed)
        x.copy_(torch.randn_like(x))
        logits.copy_(torch.randn_like(logits) * (seed + 1))
        graph.replay()
        torch.testing.assert_close(out, fused_moe_ref(x, w13, w2, *route_ref(logits, top_k, True)), **tol(torch.bfloat16))


@pytest.mark.parametrize("with_bias", [False, True])
def test_skinny_linear(with_bias):
    """Small decode batches' linear layers against F.linear: 1 to 16 rows, K a multiple of the K tile or not, K
    whole in a program or sliced over several (split-K: the last program of a column block sums the slices, and
    leaves its counter at 0 for the next launch, which the repeated launches check)."""
    from raygrid.kernels.triton_linear import skinny_linear

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    shapes = [(4096, 1024), (1024, 3072), (6144, 1024), (1000, 200)] if ON_GPU else [(40, 64), (24, 200)]
    for n, k in shapes:
        weight = torch.randn(n, k, dtype=dtype, device=DEVICE) / k**0.5
        bias = torch.randn(n, dtype=dtype, device=DEVICE) if with_bias else None
        for m, split_k in [(1, 1), (3, 1), (16, 1), (1, 3), (16, 2), (5, 3), (1, 3)]:
            x = torch.randn(m, k, dtype=dtype, device=DEVICE)
            expected = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
            got = skinny_linear(x, weight, bias, block_n=16, block_k=64 if not ON_GPU else None, split_k=split_k)
            torch.testing.assert_close(got.float(), expected, **tol(dtype))
    with pytest.raises(ValueError, match="at most 16 rows"):
        skinny_linear(torch.randn(17, 64, dtype=dtype, device=DEVICE), torch.randn(8, 64, dtype=dtype, device=DEVICE))


@pytest.mark.skipif(not ON_GPU, reason="on CPU ops.linear runs fp8_linear_ref itself")
def test_fp8_linear_on_gpu_matches_its_reference():
    """FP8 layers on a GPU (per-token activation scales; torch._scaled_mm with unit scales and the scales applied
    after, up to FP8_TENSORWISE_MAX_M rows, with row-wise scales above) against fp8_linear_ref, for decode-sized
    and prefill-sized batches, with and without a bias."""
    from raygrid.kernels import ops
    from raygrid.models.layers.fp8 import fp8_linear_ref, quantize_per_channel

    torch.manual_seed(0)
    weight, scale = quantize_per_channel(torch.randn(4096, 1024, device=DEVICE) / 32)
    bias = torch.randn(4096, dtype=torch.bfloat16, device=DEVICE)
    assert ops.FP8_TENSORWISE_MAX_M == 256
    for m in (1, 5, 16, 256, 257, 1000):
        x = torch.randn(m, 1024, dtype=torch.bfloat16, device=DEVICE)
        for b in (None, bias):
            torch.testing.assert_close(ops.linear(x, weight, b, scale).float(), fp8_linear_ref(x, weight, scale, b).float(),
                                       atol=2e-2, rtol=2e-2)


def test_per_token_fp8_quant_matches_its_reference():
    """The FP8 layers' activation quantization against quantize_per_token, bit for bit: scales and float8 values,
    rows held in registers and rows of more than ONE_PASS_MAX elements (two passes), float32 and bf16 inputs, a
    zero row, -0, values that round to float8's subnormals, and a row of every tie between two float8 numbers with
    its float32 neighbours (scaled by 1: its largest value is 448), where round-to-nearest-even decides."""
    from raygrid.kernels.triton_quant import ONE_PASS_MAX, per_token_quant_fp8
    from raygrid.kernels.elementwise_ref import FP8, MIN_SCALE, quantize_per_token

    grid = torch.arange(127, dtype=torch.uint8).view(FP8).float()  # every finite float8 >= 0, ascending
    ties = (grid[1:] + grid[:-1]) / 2
    tie_row = torch.cat([ties, torch.nextafter(ties, grid[1:]), torch.nextafter(ties, grid[:-1]), grid])
    tie_row = torch.cat([tie_row, -tie_row]).to(DEVICE)
    torch.manual_seed(0)
    for m, k in ([(1, 4096), (7, 14336), (300, 1024), (3, 20000)] if ON_GPU else [(3, 200), (2, ONE_PASS_MAX + 100)]):
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(m, k, device=DEVICE) * torch.rand(m, 1, device=DEVICE) * 10
            x[0, :4] = torch.tensor([-0.0, 1e-6, -2e-5, 3e-4])
            x[-1] = 0
            cases = [x.to(dtype)] + ([tie_row[None, :]] if dtype == torch.float32 and k == 200 or k == 1024 else [])
            for x in cases:
                q, scale = per_token_quant_fp8(x, MIN_SCALE)
                ref_q, ref_scale = quantize_per_token(x)
                assert q.dtype == FP8 and scale.shape == (x.shape[0], 1)
                assert torch.equal(scale, ref_scale), (m, k, dtype)
                assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)), (m, k, dtype)



def test_scale_fp8_product_matches_torch():
    """The small FP8 batches' epilogue: a product scaled per row and per column, plus a bias, in place."""
    from raygrid.kernels.triton_quant import scale_fp8_product

    dtype = torch.bfloat16 if ON_GPU else torch.float32
    for m, n in ((1, 300), (5, 4096), (40, 700)):
        y = torch.randn(m, n, device=DEVICE).to(dtype) * 1000
        x_scale, w_scale = torch.rand(m, 1, device=DEVICE), torch.rand(n, device=DEVICE)
        bias = torch.randn(n, device=DEVICE).to(dtype)
        for b in (None, bias):
            expected = y.float() * x_scale * w_scale + (0 if b is None else b.float())
            got = scale_fp8_product(y.clone(), x_scale, w_scale, b)
            torch.testing.assert_close(got.float(), expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_silu_and_mul_hand_fp8_layers_their_input_quantized(dtype):
    """RMSNorm (with and without the residual add) and SiLU-and-mul ending in the per-token FP8 quantization of the
    layer they feed: bit for bit what per_token_quant_fp8 makes of their output in the model's dtype (which itself
    matches quantize_per_token bit for bit, test above); the residual stream as without it. SiLU-and-mul rows longer
    than ONE_PASS_MAX take the unfused path. Through ops, on any device: an Fp8Activation that linear takes."""
    from raygrid.kernels import ops
    from raygrid.kernels.triton_quant import ONE_PASS_MAX, per_token_quant_fp8
    from raygrid.kernels.elementwise_ref import FP8, MIN_SCALE, quantize_per_token
    from raygrid.models.layers.fp8 import fp8_linear_ref, quantize_per_channel

    def same(got, expected):
        assert got[0].dtype == FP8 and got[1].shape == expected[1].shape
        if ON_GPU and dtype == torch.float32:
            # float32 models: the compiler may contract the fused kernel's sums into FMAs differently, moving the
            # last bits of a value and so of a scale, or one value across a float8 rounding boundary (1/8 apart).
            torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=0)
            want = expected[0].float() * expected[1]
            step = want.abs() / 8 + expected[1] / 512  # one float8 step at each value (2**-9 among the subnormals)
            assert ((got[0].float() * got[1] - want).abs() <= step * 1.001).all()
            return
        assert torch.equal(got[1], expected[1])
        assert torch.equal(got[0].view(torch.uint8), expected[0].view(torch.uint8))

    torch.manual_seed(0)
    hidden, inters = (4096, [14336, ONE_PASS_MAX + 8]) if ON_GPU else (64, [48, ONE_PASS_MAX + 8])
    x = torch.randn(13, hidden, dtype=dtype, device=DEVICE) * 3
    x[-1] = 0  # a zero row keeps the smallest scale
    w = torch.randn(hidden, dtype=dtype, device=DEVICE)
    r = torch.randn_like(x)
    same(rms_norm(x, w, 1e-6, fp8_min_scale=MIN_SCALE), per_token_quant_fp8(rms_norm(x, w, 1e-6), MIN_SCALE))
    normed, res = rms_norm(x, w, 1e-6, r, fp8_min_scale=MIN_SCALE)
    plain, plain_res = rms_norm(x, w, 1e-6, r)
    same(normed, per_token_quant_fp8(plain, MIN_SCALE))
    assert torch.equal(res, plain_res)
    for n in inters:
        gate_up = torch.randn(5, 2 * n, dtype=dtype, device=DEVICE) * 4
        same(silu_and_mul(gate_up, fp8_min_scale=MIN_SCALE), per_token_quant_fp8(silu_and_mul(gate_up), MIN_SCALE))

    weight, scale = quantize_per_channel(torch.randn(96, hidden, device=DEVICE) / 32)
    act, act_res = ops.rms_norm(x, w, 1e-6, r, fp8=True)
    plain, plain_res = ops.rms_norm(x, w, 1e-6, r)
    assert isinstance(act, ops.Fp8Activation) and act.dtype == dtype and torch.equal(act_res, plain_res)
    same(act, quantize_per_token(plain))
    if not (ON_GPU and dtype == torch.float32):
        assert torch.equal(ops.linear(act, weight, None, scale), ops.linear(plain, weight, None, scale))
    torch.testing.assert_close(ops.linear(act, weight, None, scale).float(), fp8_linear_ref(plain, weight, scale).float(),
                               atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError, match="needs FP8 weights"):
        ops.linear(act, weight.float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp8_products_scaled_by_the_kernel_that_reads_them(dtype):
    """An FP8 layer's product with unit scales (ops.Fp8Product) read by RMSNorm (with and without the residual add,
    with and without an FP8 output) and, as a qkv product, by rotary and by Qwen3's q/k norms with rotary (v scaled in
    place), each scaling it as it loads it: bit for bit what they make of it scaled first by scale_fp8_product.
    Through ops: small batches' FP8 layers hand over an Fp8Product on a GPU when asked (a plain tensor above
    FP8_TENSORWISE_MAX_M rows, with a bias, and on CPU), and ops.rms_norm, ops.rotary and ops.qk_norm_rotary take it
    on any device."""
    from raygrid.kernels import ops
    from raygrid.kernels.elementwise_ref import MIN_SCALE
    from raygrid.kernels.triton_quant import scale_fp8_product
    from raygrid.models.layers.fp8 import quantize_per_channel

    def same(got, expected):
        if isinstance(got, tuple):  # (values, scales), or (norm, residual)
            assert isinstance(expected, tuple) and len(got) == len(expected)
            return [same(g, e) for g, e in zip(got, expected)]
        g, e = got, expected
        assert g.dtype == e.dtype and g.shape == e.shape
        if g.dtype == torch.float8_e4m3fn:
            g, e = g.view(torch.uint8), e.view(torch.uint8)
        if ON_GPU and dtype == torch.float32:
            # float32 models: nothing rounds between the scaling and what follows, which the compiler may contract
            # into FMAs; a value may then land one float8 step away.
            if g.dtype != torch.uint8:
                torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
            return
        assert torch.equal(g, e)

    def product(m, n):
        return torch.randn(m, n, device=DEVICE).to(dtype) * 300, torch.rand(m, 1, device=DEVICE) / 100, torch.rand(n, device=DEVICE) / 50

    hidden = 4096 if ON_GPU else 64
    y, xs, ws = product(9, hidden)
    w = torch.randn(hidden, dtype=dtype, device=DEVICE)
    r = torch.randn(9, hidden, dtype=dtype, device=DEVICE)
    first = scale_fp8_product(y.clone(), xs, ws, None)
    for residual in (None, r):
        for fp8 in (None, MIN_SCALE):
            same(rms_norm(y, w, 1e-6, residual, fp8_min_scale=fp8, product_scales=(xs, ws)),
                 rms_norm(first, w, 1e-6, residual, fp8_min_scale=fp8))
    # The qkv product: rotary (Llama) and q/k norms with rotary (Qwen3) scale q and k as they read them, v in place.
    heads, kv_heads, head_dim = (32, 8, 128) if ON_GPU else (4, 2, 16)
    width = (heads + 2 * kv_heads) * head_dim
    positions = torch.randint(0, 64, (7,), device=DEVICE)
    angles = torch.rand(64, head_dim // 2, device=DEVICE).repeat(1, 2)  # the two halves rotate by the same angles
    cos, sin = angles.cos(), angles.sin()
    qw, kw = torch.randn(head_dim, dtype=dtype, device=DEVICE), torch.randn(head_dim, dtype=dtype, device=DEVICE)

    def split(qkv):
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        return q.view(7, heads, head_dim), k.view(7, kv_heads, head_dim), v.view(7, kv_heads, head_dim)

    qkv, xs, ws = product(7, width)
    for norms in (False, True):
        first, fused = split(scale_fp8_product(qkv.clone(), xs, ws, None)), split(qkv.clone())
        if norms:
            expected = qk_norm_rotary(positions, *first[:2], qw, kw, 1e-6, cos, sin) + first[2:]
            got = qk_norm_rotary(positions, *fused[:2], qw, kw, 1e-6, cos, sin, fused[2], (xs, ws)) + fused[2:]
        else:
            expected = rotary_inplace(positions, *first[:2], cos, sin) + first[2:]
            got = rotary_inplace(positions, *fused[:2], cos, sin, fused[2], (xs, ws)) + fused[2:]
        same(got, expected)
        # Through ops (on CPU: the reference, which scales first).
        fused = split(qkv.clone())
        got = (ops.qk_norm_rotary(positions, *fused[:2], qw, kw, 1e-6, cos, sin, fused[2], (xs, ws)) if norms
               else ops.rotary(positions, *fused[:2], cos, sin, fused[2], (xs, ws))) + fused[2:]
        torch.testing.assert_close(tuple(g.float() for g in got), tuple(e.float() for e in expected), **tol(dtype))
    q, k, v = split(qkv.clone())
    with pytest.raises(ValueError, match="slices of one product"):
        rotary_inplace(positions, q, k, cos, sin, v.clone(), (xs, ws))

    def copy(p):  # scaled() scales in place (a product is read once)
        return ops.Fp8Product(p.values.clone(), p.x_scale, p.weight_scale)

    weight, scale = quantize_per_channel(torch.randn(hidden, 96, device=DEVICE) / 32)
    bias = torch.randn(hidden, dtype=dtype, device=DEVICE)
    for m in (3, 300):
        x = torch.randn(m, 96, dtype=dtype, device=DEVICE)
        res = torch.randn(m, hidden, dtype=dtype, device=DEVICE)
        deferred = ops.linear(x, weight, None, scale, defer_scale=True)
        assert isinstance(deferred, ops.Fp8Product) == (ON_GPU and m <= ops.FP8_TENSORWISE_MAX_M), m
        assert not isinstance(ops.linear(x, weight, bias, scale, defer_scale=True), ops.Fp8Product)
        plain = ops.linear(x, weight, None, scale)
        if isinstance(deferred, ops.Fp8Product):
            same(copy(deferred).scaled(), plain)
        same(ops.rms_norm(deferred, w, 1e-6, res), ops.rms_norm(plain, w, 1e-6, res))
        # On CPU the layer's reference made a tensor: an Fp8Product to read comes from here.
        deferred = ops.Fp8Product(*product(m, hidden))
        torch.testing.assert_close(copy(deferred).scaled().float(), deferred.values.float() * deferred.x_scale * deferred.weight_scale,
                                   **tol(dtype))
        for fp8 in (False, True):
            got, expected = ops.rms_norm(copy(deferred), w, 1e-6, res, fp8=fp8), ops.rms_norm(copy(deferred).scaled(), w, 1e-6, res, fp8=fp8)
            same((tuple(got[0][:2]), got[1]) if fp8 else got, (tuple(expected[0][:2]), expected[1]) if fp8 else expected)
