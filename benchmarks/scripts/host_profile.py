"""Where a lone request's decode steps spend the host's time, function by function: cProfile over one request's
decode (after a warm-up request), printed by own time and by cumulative time. On a GPU the forward pass and the
sampler only launch work, so what shows is the host's; on a CPU the forward pass computes too.

    python benchmarks/scripts/host_profile.py OUT.txt [--model DIR] [--input-len 512] [--output-len 300]
        [--temperature 0] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import time
from pathlib import Path

from prompt_admission import git_commit, tiny_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny Qwen3 made here)")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args()

    from raygrid import LLM, SamplingParams

    llm = LLM(model=args.model or str(tiny_model(4096)), max_model_len=args.input_len + args.output_len + 8)
    ids = [random.randrange(llm.llm_engine.processor.vocab_size) for _ in range(args.input_len)]
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=args.temperature)
    request = [{"prompt_token_ids": ids}]
    llm.generate(request, params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    llm.generate(request, params, use_tqdm=False)
    unprofiled_ms = (time.perf_counter() - start) * 1e3 / args.output_len
    profile = cProfile.Profile()
    profile.enable()
    llm.generate(request, params, use_tqdm=False)
    profile.disable()
    text = io.StringIO()
    text.write(f"git {git_commit()}, input {args.input_len}, output {args.output_len}, temperature {args.temperature}; "
               f"unprofiled: {unprofiled_ms:.3f} ms a token (prompt included)\n")
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    Path(args.output).write_text(text.getvalue())
    print(text.getvalue()[:3000])
    llm.shutdown()


if __name__ == "__main__":
    main()
