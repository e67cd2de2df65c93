"""A decode pass of a few sequences (``--rows``, 1 by default) as one persistent launch (``kernels/persistent_decode.py``)
against the engine's layer-by-layer pass, on Qwen3-0.6B's shape (random weights, ``load_format="dummy"``), at
several context lengths (each row's).

Both are captured in CUDA graphs and replayed, as the engine replays its decode graphs; the time is the model's
forward pass alone (no LM head, no sampling). For each context it also records:
- ``max_abs_diff`` / ``ref_max``: the persistent pass's final hidden state against the engine's, both bf16;
- ``same_argmax``: whether the two give the same greedy token through the LM head (every row);
- ``kv_max_diff``: how far apart the keys and values both wrote into the tokens' cache slots are;
- ``same_bits_twice``: two persistent passes over the same inputs agree to the bit;
- ``same_bits_as_default``: the variant's hidden state is the default launch's to the bit (a variant that changes
  only what is asked into L2 must give it);
- ``floor_us``: the pass's bytes (weights outside the embedding, plus the K/V read) at the bandwidth of a
  device-to-device copy on this GPU (``copy_bandwidth_bytes_per_s``, as ``raygrid bench latency`` puts its floor);
- ``stage_us_one_pass``: from one pass of a timed launch, each stage's mean time a layer, up to its barrier's end;
- with ``--timeline N``, ``barrier_timeline``: N passes of a launch in which every program records when its threads
  met before each barrier and when it passed it (``timed="programs"``), each stage's figures in us, the mean over the
  passes and the layers (``barrier_timeline`` below says what each is).

    python benchmarks/scripts/persistent_decode_pass.py OUT.json --contexts 512 4096 32768 [--rows 2] [--variant JSON ...]

Each ``--variant`` is a JSON of ``PersistentDecode`` keyword arguments (``num_warps``, ``num_stages``, ``block_n``,
``splits``), timed beside the default launch. ``--kernel-module`` times another module's ``PersistentDecode`` (an
earlier commit's copy of the kernel, for an A/B within one command; one row only if it predates ``rows``).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

import torch

from raygrid.bench.kernel_timing import chain_us
from raygrid.bench.memory_floor import copy_bandwidth
from raygrid.bench.throughput import provenance
from raygrid.engine.memory_profile import decode_metadata, sequence_metadata
from raygrid.models.default_model import load_dummy_qwen3_0_6b
from raygrid.models.layers.attention import AttentionMetadata

PAGE = 64


def decode_inputs(context: int, rows: int, num_blocks: int, device) -> tuple[dict, AttentionMetadata]:
    """``rows`` sequences whose ``context`` cached tokens each lie in random pages, and their next tokens at position
    ``context``: the launch's inputs, and the model's metadata for the same step."""
    pages = -(-(context + 1) // PAGE)
    blocks = (torch.randperm(num_blocks - 1, device=device)[:rows * pages] + 1).to(torch.int32).reshape(rows, pages)
    steps = [sequence_metadata(blocks[r:r + 1], context, 1, PAGE) for r in range(rows)]
    positions = torch.cat([p for p, _ in steps])
    seq_lens = torch.cat([m.seq_lens_tensor for _, m in steps])
    meta = decode_metadata(torch.cat([m.slot_mapping for _, m in steps]), blocks, seq_lens)
    inputs = dict(ids=torch.arange(17, 17 + rows, device=device), positions=positions, slot_mapping=meta.slot_mapping,
                  block_tables=blocks, seq_lens=seq_lens)
    return inputs, meta


STAGES = ("qkv", "attention", "o_proj", "gate_up", "down")


def barrier_timeline(passes: list[torch.Tensor]) -> dict:
    """Each stage's figures from ``PersistentDecode.program_times`` of several passes (us, the mean over the passes
    and the layers; a stage runs from the barrier before it, passed, to its own, passed):
    - ``stage``: the median program's pass of its barrier after the median program's pass of the one before;
    - ``work``, ``work_max``: from a program's pass of the barrier before to its threads meeting before its arrival
      at the stage's own, the median program's and the slowest's;
    - ``last_arrival``: the last program's arrival after the median program's pass of the barrier before;
    - ``barrier``: the median program's pass after the last program's arrival (what the barrier itself costs);
    - ``pass_spread``: from the first program's pass to the last's;
    - ``last_programs``: the programs most often the last to arrive, with how often, and the SM each ran on;
    and ``programs_an_sm``: how many SMs ran 1, 2, ... of the launch's programs; ``sm_of_program``: each one's SM."""
    figures = {stage: {key: [] for key in ("stage", "work", "work_max", "last_arrival", "barrier", "pass_spread")}
               for stage in STAGES}
    last = {stage: torch.zeros(passes[0].shape[1], dtype=torch.int64) for stage in STAGES}
    for times in passes:
        times = times.double() / 1e3
        for k in range(1, times.shape[0]):
            stage = STAGES[(k - 1) % len(STAGES)]
            before, done, passed = times[k - 1, :, 1], times[k, :, 0], times[k, :, 1]
            work = done - before
            f = figures[stage]
            f["stage"].append((passed.median() - before.median()).item())
            f["work"].append(work.median().item())
            f["work_max"].append(work.max().item())
            f["last_arrival"].append((done.max() - before.median()).item())
            f["barrier"].append((passed.median() - done.max()).item())
            f["pass_spread"].append((passed.max() - passed.min()).item())
            last[stage][int(done.argmax())] += 1
    sms = passes[0][0, :, 0]
    summary = {}
    for stage in STAGES:
        summary[stage] = {key: sum(values) / len(values) for key, values in figures[stage].items()}
        counts, programs = last[stage].sort(descending=True)
        summary[stage]["last_programs"] = [[int(p), int(c), int(sms[p])] for p, c in zip(programs[:4], counts[:4])
                                           if c > 0]
    per_sm = torch.bincount(sms)
    summary["programs_an_sm"] = {str(n): int((per_sm == n).sum()) for n in per_sm.unique().tolist() if n > 0}
    summary["sm_of_program"] = sms.tolist()
    return summary


def run_variant(PersistentDecode, model, caches, inputs: dict, variant: dict, ref: torch.Tensor, ref_kv: list,
                engine_us: float, replays: int, default: torch.Tensor | None,
                timeline: int = 0) -> tuple[dict, torch.Tensor]:
    """One launch of ``PersistentDecode(**variant)``: its time, its result against the engine's pass and against the
    default launch's (``default``), and the result."""
    slots = inputs["slot_mapping"].tolist()
    runner = PersistentDecode(model, caches, **variant)
    run = lambda: runner(inputs["ids"], inputs["positions"], inputs["slot_mapping"], inputs["block_tables"],  # noqa: E731
                         inputs["seq_lens"])
    first = run().clone()
    second = run().clone()
    kv_diff = max((c[:, s // PAGE, s % PAGE].float() - r.float()).abs().max().item()
                  for c, ref_slots in zip(caches, ref_kv) for s, r in zip(slots, ref_slots))
    logits = model.compute_logits(torch.cat([ref, first])).argmax(-1)
    us = chain_us([run], replays)
    runner.check()
    timed = PersistentDecode(model, caches, timed=True, **variant)
    timed(inputs["ids"], inputs["positions"], inputs["slot_mapping"], inputs["block_tables"], inputs["seq_lens"])
    timed.check()
    extra = {}
    if timeline:
        programs = PersistentDecode(model, caches, timed="programs", **variant)
        passes = []
        for _ in range(timeline):
            programs(inputs["ids"], inputs["positions"], inputs["slot_mapping"], inputs["block_tables"],
                     inputs["seq_lens"])
            passes.append(programs.program_times())
        programs.check()
        extra["barrier_timeline"] = barrier_timeline(passes)
    return dict(variant=variant, us=us, speedup=engine_us / us,
                max_abs_diff=(first.float() - ref.float()).abs().max().item(), ref_max=ref.float().abs().max().item(),
                same_argmax=bool(torch.equal(logits[:len(slots)], logits[len(slots):])), kv_max_diff=kv_diff,
                same_bits_twice=bool(torch.equal(first, second)),
                same_bits_as_default=None if default is None else bool(torch.equal(first, default)),
                splits=runner.splits, programs=runner.num_programs,
                stage_us_one_pass=dict(zip(STAGES, timed.stage_us())), **extra), first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_json")
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 32768])
    parser.add_argument("--variant", action="append", default=[], help="JSON of PersistentDecode keyword arguments")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1, help="sequences in the pass, each of the context given")
    parser.add_argument("--kernel-module", default="raygrid.kernels.persistent_decode")
    parser.add_argument("--timeline", type=int, default=0, metavar="N",
                        help="also N passes of each launch with every program's barrier times (barrier_timeline)")
    args = parser.parse_args()
    PersistentDecode = importlib.import_module(args.kernel_module).PersistentDecode
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = load_dummy_qwen3_0_6b(device)
    limit = model.config.max_position_embeddings
    if max(args.contexts) >= limit:  # the token's position indexes the rotary tables
        parser.error(f"--contexts: at most {limit - 1} (max_position_embeddings), got {max(args.contexts)}")
    attn = model.layers[0].self_attn
    num_blocks = args.rows * -(-(max(args.contexts) + 1) // PAGE) + 8
    caches = [(torch.randn(2, num_blocks, PAGE, attn.num_kv_heads, attn.head_dim, device=device) * 0.5).to(torch.bfloat16)
              for _ in model.layers]
    weight_bytes = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    variants = [{}] + [json.loads(v) for v in args.variant]
    if args.rows > 1:
        variants = [dict(v, rows=args.rows) for v in variants]
    bandwidth = copy_bandwidth(device)
    rows = []
    for context in args.contexts:
        inputs, meta = decode_inputs(context, args.rows, num_blocks, device)
        kv_bytes = args.rows * 2 * len(model.layers) * context * attn.num_kv_heads * attn.head_dim * 2
        row = dict(context=context, floor_us=(weight_bytes + kv_bytes) / bandwidth * 1e6, variants=[])
        with torch.inference_mode():
            plain = lambda: model(inputs["ids"], inputs["positions"], caches, meta)  # noqa: E731
            ref = plain().clone()
            ref_kv = [[c[:, s // PAGE, s % PAGE].clone() for s in inputs["slot_mapping"].tolist()] for c in caches]
            row["engine_us"] = chain_us([plain], args.replays)
            default = None
            for variant in variants:
                try:
                    result, out = run_variant(PersistentDecode, model, caches, inputs, variant, ref, ref_kv,
                                              row["engine_us"], args.replays, default, args.timeline)
                    row["variants"].append(result)
                    default = out if default is None else default
                except Exception as error:  # a launch that does not compile or fit: recorded, the others still run
                    row["variants"].append(dict(variant=variant, error=f"{type(error).__name__}: {error}"[:500]))
                print(context, f"engine {row['engine_us']:.1f} us, floor {row['floor_us']:.1f} us:", row["variants"][-1], flush=True)
        rows.append(row)
    result = dict(provenance(), sequences=args.rows, kernel_module=args.kernel_module, torch=torch.__version__, triton=__import__("triton").__version__,
                  model="Qwen3-0.6B shape, random (dummy) bf16 weights", copy_bandwidth_bytes_per_s=bandwidth, rows=rows)
    Path(args.output_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
