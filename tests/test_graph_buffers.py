"""The static buffers CUDA graphs replay from (engine/cuda_graphs.py, GraphBuffers). Graphs need a GPU, but how a
replay readies the staged inputs does not: a graph over T tokens and R sequences must see the step's rows as
staged and only padding past them (slot -1, length 0, no queries), and must refuse inputs staged elsewhere. The
staging buffers those inputs arrive through (engine/staging.py) are checked here too."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from raygrid.engine.cuda_graphs import GraphBuffers
from raygrid.engine.staging import ALIGN, StagingBuffers, step_fields
from raygrid.models.layers.attention import AttentionMetadata

MAX_TOKENS, MAX_SEQS, MAX_BLOCKS = 16, 4, 3


def staged_step(staged: dict[str, torch.Tensor], query_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A step's inputs written where the runner stages them (the first rows of each tensor)."""
    n, b = sum(query_lens), len(query_lens)
    starts = torch.tensor([0] + query_lens).cumsum(0).int()
    staged["input_ids"][:n] = torch.arange(100, 100 + n)
    staged["positions"][:n] = torch.arange(n)
    staged["slot_mapping"][:n] = torch.arange(40, 40 + n)
    staged["seq_lens"][:b] = torch.tensor(query_lens, dtype=torch.int32) + 5
    staged["query_start_loc"][: b + 1] = starts
    staged["block_tables"][:b] = 7
    staged["decode_order"][:b] = torch.arange(b - 1, -1, -1)  # as the runner stages it: a permutation of the rows
    meta = AttentionMetadata(slot_mapping=staged["slot_mapping"][:n], block_tables=staged["block_tables"][:b],
                             seq_lens=[], query_start_loc=[], max_query_len=max(query_lens),
                             seq_lens_tensor=staged["seq_lens"][:b], query_start_loc_tensor=staged["query_start_loc"][: b + 1],
                             decode_order=staged["decode_order"][:b])
    return staged["input_ids"][:n], staged["positions"][:n], meta


def make_buffers() -> tuple[dict[str, torch.Tensor], GraphBuffers]:
    """The staged tensors (a model runner's StagingBuffers' device twins, here on the CPU) and the graph buffers over them."""
    staged = StagingBuffers(torch.device("cpu"), step_fields(MAX_TOKENS, MAX_SEQS, MAX_BLOCKS)).device
    return staged, GraphBuffers(staged, MAX_TOKENS, MAX_SEQS)


def test_a_replay_keeps_the_staged_rows_and_marks_only_the_padding():
    staged, buffers = make_buffers()
    # A mixed step of 3 sequences and 7 tokens, after a larger step left its values in more rows.
    buffers.prepare(12, *staged_step(staged, [4, 3, 2, 1]), None, num_seqs=MAX_SEQS, queries=True)
    assert buffers.prepare(8, *staged_step(staged, [5, 1, 1]), None, num_seqs=MAX_SEQS, queries=True) == 7
    assert buffers.input_ids[:7].tolist() == list(range(100, 107))
    assert buffers.slot_mapping[:8].tolist() == list(range(40, 47)) + [-1]
    assert buffers.seq_lens.tolist() == [10, 6, 6, 0]
    assert buffers.query_start_loc.tolist() == [0, 5, 6, 7, 7]
    # The metadata a graph was captured with reads these same tensors.
    captured = buffers.metadata(8, MAX_SEQS, max_query_len=8)
    assert captured.seq_lens_tensor.data_ptr() == staged["seq_lens"].data_ptr()
    assert captured.block_tables.tolist()[:3] == [[7] * MAX_BLOCKS] * 3
    # A decode graph of 4 rows for 2 sequences: their lengths kept, the other two rows padding.
    assert buffers.prepare(4, *staged_step(staged, [1, 1]), None, num_seqs=4) == 2
    assert buffers.slot_mapping[:4].tolist() == [40, 41, -1, -1]
    assert buffers.seq_lens.tolist() == [6, 6, 0, 0]
    # The order the decode kernel starts them in: the step's permutation, then the padding rows, each once (the
    # larger step before left its own order in those rows).
    assert buffers.decode_order.tolist() == [1, 0, 2, 3]
    assert buffers.metadata(4, 4, max_query_len=1).decode_order.data_ptr() == staged["decode_order"].data_ptr()


def test_a_replay_refuses_inputs_not_staged_in_its_buffers():
    """Token ids, positions or slots from anywhere but the staged tensors would be read stale by the graph."""
    staged, buffers = make_buffers()
    input_ids, positions, meta = staged_step(staged, [2])
    elsewhere = dataclasses.replace(meta, slot_mapping=meta.slot_mapping.clone())
    for args in ((torch.arange(2), positions, meta), (input_ids, torch.arange(2), meta), (input_ids, positions, elsewhere)):
        with pytest.raises(ValueError, match="staged inputs"):
            buffers.prepare(4, *args, None, num_seqs=1)
    assert buffers.prepare(4, input_ids, positions, meta, None, num_seqs=1) == 2


def test_the_result_is_copied_to_static_outputs_for_the_steps_rows():
    _, buffers = make_buffers()
    hidden, residual = torch.randn(MAX_TOKENS, 8), torch.randn(MAX_TOKENS, 8)
    buffers.keep((hidden[:6], residual[:6]))
    first = buffers.outputs
    buffers.keep((hidden[:3] * 2, residual[:3] * 2))
    assert buffers.outputs is first  # allocated once, at the largest size
    out_hidden, out_residual = buffers.result(3)
    torch.testing.assert_close(out_hidden, hidden[:3] * 2)
    torch.testing.assert_close(out_residual, residual[:3] * 2)


def test_staging_copies_a_group_of_fields_in_one_span_at_fixed_aligned_places():
    """StagingBuffers: each field has one fixed place (its device twin, which graphs read), aligned as a tensor of its
    own would be; a group staged together lands there with its values and dtypes, skipped fields (None) untouched
    by the caller, and on a GPU through alternating pinned host buffers."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    staging = StagingBuffers(device, {
        "input_ids": ((MAX_TOKENS,), torch.int64), "seq_lens": ((MAX_SEQS,), torch.int32),
        "greedy": ((MAX_SEQS,), torch.bool), "top_k": ((MAX_SEQS,), torch.int64),
        "block_tables": ((MAX_SEQS, MAX_BLOCKS), torch.int32), "seeds": ((MAX_SEQS,), torch.int64)})
    offsets = list(staging.offsets.values())
    assert offsets == sorted(offsets) and all(o % ALIGN == 0 for o in offsets)
    for name, tensor in staging.device.items():
        assert tensor.data_ptr() % 16 == 0 and tensor.shape == staging.specs[name][0] and tensor.dtype == staging.specs[name][1]
    for step in range(3):  # a GPU alternates two host buffers: each step's values must still arrive
        staging.next_step()
        staged = staging.stage(input_ids=np.arange(5) + 10 * step, seq_lens=np.array([3, 4 + step], dtype=np.int64),
                               greedy=np.array([True, False]), top_k=None,
                               block_tables=np.array([[1, 2], [3, 4 + step]], dtype=np.int64))
        staged_seeds = staging.stage(seeds=np.array([2**62 + step, -1]))
        assert set(staged) == {"input_ids", "seq_lens", "greedy", "block_tables"} and set(staged_seeds) == {"seeds"}
        for name, tensor in {**staged, **staged_seeds}.items():
            assert tensor.data_ptr() == staging.device[name].data_ptr() and tensor.dtype == staging.specs[name][1]
        assert staged["input_ids"].tolist() == list(range(10 * step, 10 * step + 5))
        assert staged["seq_lens"].tolist() == [3, 4 + step]
        assert staged["greedy"].tolist() == [True, False]
        assert staged["block_tables"][:, :2].tolist() == [[1, 2], [3, 4 + step]]
        assert staged_seeds["seeds"].tolist() == [2**62 + step, -1]
