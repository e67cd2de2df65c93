"""W1's memory floor, whole and by the decode buckets ``w1_step_timeline.py`` and ``raygrid bench throughput``'s
``where_the_time_goes`` report: every decode step's weights and KV reads (``memory_floor.decode_floor``) at a given
bandwidth, no GPU needed. It takes every request as decoding from the first step with its whole prompt cached (the
engine admits W1's 256 prompts over its first 19 steps, so the first buckets' step counts differ by a few).

    python benchmarks/scripts/w1_floor.py --bandwidth 3.03e12 [--model random-qwen3-0.6b] [--num-prompts 256]
"""

from __future__ import annotations

import argparse
import json

from raygrid.bench.memory_floor import decode_floor
from raygrid.bench.throughput import make_workload, step_kind
from raygrid.models.default_model import resolve_model_path
from raygrid.models.loader import load_hf_config

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bandwidth", type=float, required=True, help="bytes/s (an H100 copies at about 3.03e12)")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-prompts", type=int, default=256)
    args = parser.parse_args()
    config = load_hf_config(resolve_model_path(args.model))
    prompts, output_lens = make_workload(args.num_prompts, None, None, (100, 1024), 0, config.vocab_size)
    lengths = [len(p) for p in prompts]
    buckets: dict[str, dict] = {}
    for step in range(max(output_lens)):
        running = [p + step for p, n in zip(lengths, output_lens) if n > step]
        name = step_kind(len(running), len(running))
        floor = decode_floor(config, len(running), sum(running), bandwidth=args.bandwidth)["floor_ms"] / 1e3
        b = buckets.setdefault(name, dict(steps=0, floor_s=0.0))
        b.update(steps=b["steps"] + 1, floor_s=b["floor_s"] + floor)
    total = sum(b["floor_s"] for b in buckets.values())
    print(json.dumps(dict(bandwidth=args.bandwidth, output_tokens=sum(output_lens), floor_s=round(total, 3),
                          floor_output_tok_s=round(sum(output_lens) / total, 1),
                          buckets={k: dict(steps=v["steps"], floor_s=round(v["floor_s"], 3)) for k, v in buckets.items()}),
                     indent=1))


if __name__ == "__main__":
    main()
