"""The static buffers CUDA graphs replay from (engine/cuda_graphs.py, GraphBuffers). Graphs need a GPU, but how a
replay readies the staged inputs does not: a graph over T tokens and R sequences must see the step's rows as
staged and only padding past them (slot -1, length 0, no queries), and must refuse inputs staged elsewhere."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from raygrid.engine.cuda_graphs import GraphBuffers
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
    """The staged tensors (on a GPU, StagingBuffers' device twins) and the graph buffers over them."""
    staged = {"input_ids": torch.zeros(MAX_TOKENS, dtype=torch.int64), "positions": torch.zeros(MAX_TOKENS, dtype=torch.int64),
              "slot_mapping": torch.zeros(MAX_TOKENS, dtype=torch.int64), "seq_lens": torch.zeros(MAX_SEQS, dtype=torch.int32),
              "query_start_loc": torch.zeros(MAX_SEQS + 1, dtype=torch.int32),
              "block_tables": torch.zeros(MAX_SEQS, MAX_BLOCKS, dtype=torch.int32), "decode_order": torch.zeros(MAX_SEQS, dtype=torch.int32)}
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
