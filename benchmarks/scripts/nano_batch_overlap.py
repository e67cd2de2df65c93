"""Would a decode step gain by running its batch as two halves on two CUDA streams? A probe, not an engine mode.

A W1 decode step of 256 requests is 1.16x its memory floor on an H100: attention reads the cache at 97% of the copy
rate, and the products (0.83 ms of 6.7) and small kernels run between attention launches, reading little. Two halves
of the batch, each a whole forward pass on its own stream, could let one half's products run while the other's
attention reads (as NanoFlow overlaps nano-batches). This times, on Qwen3-0.6B's shape (random weights), the model's
forward pass (no LM head, no sampling) for ``B`` decode rows whose contexts are uniform in ``[lo, hi]``:

- ``full``: the batch in one pass, as the engine runs it;
- ``halves_one_stream``: the two halves one after the other (what splitting costs with no overlap);
- ``halves_two_streams``: the two halves at once, one on a second stream;

each captured in one CUDA graph and replayed. It also records the halves' result against the full pass's (the
products see other row counts, so cuBLAS may add in another order: a max abs difference, not bits).

    python benchmarks/scripts/nano_batch_overlap.py OUT.json --batches 64 128 256 --contexts 300 1800
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.memory_floor import copy_bandwidth
from raygrid.bench.throughput import provenance
from raygrid.engine.memory_profile import decode_metadata
from raygrid.models.default_model import load_dummy_qwen3_0_6b
from raygrid.models.layers.attention import AttentionMetadata

PAGE = 64
POOL = 4096  # pages a layer: contexts share random pages of this pool; each row's own last page is its own


def model_and_caches(device) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """Qwen3-0.6B's shape with dummy bf16 weights, and a cache of ``POOL`` pages a layer filled with N(0, 0.25) values
    (drawn from torch's global generator, after the model: seed it first for the same inputs)."""
    model = load_dummy_qwen3_0_6b(device)
    attn = model.layers[0].self_attn
    caches = [(torch.randn(2, POOL, PAGE, attn.num_kv_heads, attn.head_dim, device=device) * 0.5).to(torch.bfloat16)
              for _ in model.layers]
    return model, caches


def decode_batch(contexts: list[int], device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """ids, positions and metadata of one decode token for each context (the token at position ``context``)."""
    rows = len(contexts)
    pages = max(-(-(c + 1) // PAGE) for c in contexts)
    table = torch.randint(rows, POOL, (rows, pages), dtype=torch.int32, device=device)
    seq_lens = torch.tensor([c + 1 for c in contexts], dtype=torch.int32, device=device)
    last = (seq_lens - 1) // PAGE
    table[torch.arange(rows, device=device), last.long()] = torch.arange(rows, dtype=torch.int32, device=device)
    positions = (seq_lens - 1).long()
    slots = table[torch.arange(rows, device=device), last.long()].long() * PAGE + positions % PAGE
    ids = torch.randint(0, 150000, (rows,), device=device)
    return ids, positions, decode_metadata(slots, table, seq_lens)


def batch_rows(batch, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Rows ``lo .. hi`` of a ``decode_batch`` as a batch of their own: the same tokens, pages and slots, so that a
    pass over them compares with the whole batch's."""
    ids, positions, meta = batch
    return ids[lo:hi], positions[lo:hi], decode_metadata(meta.slot_mapping[lo:hi], meta.block_tables[lo:hi],
                                                         meta.seq_lens_tensor[lo:hi])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_json")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 128, 192, 256])
    parser.add_argument("--contexts", type=int, nargs=2, default=[300, 1800], metavar=("LO", "HI"))
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    model, caches = model_and_caches(device)
    attn = model.layers[0].self_attn
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    bandwidth = copy_bandwidth(device)
    side = torch.cuda.Stream(device)
    rows_out = []
    for batch in args.batches:
        contexts = torch.randint(args.contexts[0], args.contexts[1] + 1, (batch,)).tolist()
        full = decode_batch(contexts, device)
        half = batch // 2
        first, second = batch_rows(full, 0, half), batch_rows(full, half, batch)
        kv_bytes = 2 * len(model.layers) * sum(contexts) * attn.num_kv_heads * attn.head_dim * 2
        floor_us = (weight_bytes + kv_bytes) / bandwidth * 1e6
        with torch.inference_mode():
            run_full = lambda: model(full[0], full[1], caches, full[2])  # noqa: E731
            run_first = lambda: model(first[0], first[1], caches, first[2])  # noqa: E731
            run_second = lambda: model(second[0], second[1], caches, second[2])  # noqa: E731

            def two_streams():
                here = torch.cuda.current_stream()
                side.wait_stream(here)
                with torch.cuda.stream(side):
                    b = run_second()
                a = run_first()
                here.wait_stream(side)
                return a, b

            ref = run_full().clone()
            a, b = two_streams()
            torch.cuda.synchronize()
            diff = (torch.cat([a, b]).float() - ref.float()).abs().max().item()
            row = dict(batch=batch, contexts=[min(contexts), max(contexts)], mean_context=sum(contexts) / batch,
                       floor_us=floor_us, max_abs_diff=diff, ref_max=ref.float().abs().max().item())
            for rnd in range(2):  # alternating, twice
                row.setdefault("full_us", []).append(chain_us([run_full], args.replays))
                row.setdefault("halves_one_stream_us", []).append(chain_us([run_first, run_second], args.replays) * 2)
                row.setdefault("halves_two_streams_us", []).append(chain_us([two_streams], args.replays))
        print(json.dumps(row), flush=True)
        rows_out.append(row)
    result = dict(provenance(), torch=torch.__version__, triton=__import__("triton").__version__,
                  model="Qwen3-0.6B shape, random (dummy) bf16 weights", copy_bandwidth_bytes_per_s=bandwidth,
                  rows=rows_out)
    Path(args.output_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
