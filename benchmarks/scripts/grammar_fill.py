"""How fast llguidance fills a batch's token masks, by how the batch's matchers were made: deep copies of one
compiled matcher ("copies", at 1 thread and at llguidance's default), a matcher built per request ("fresh"), or
copies of k independent matchers ("roots4", "roots12"). 256 matchers of structured_cost.py's two schemas advance
20 steps by random allowed tokens; per step, the time to fill the masks and to consume the tokens (in parallel).

    python benchmarks/scripts/grammar_fill.py          # prints one line per (schema, way, threads)
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from structured_cost import BOUNDED, ENDLESS  # noqa: E402


def main() -> None:
    import llguidance
    from llguidance.numpy import fill_next_token_bitmask_par

    from raygrid.engine.sampling_params import StructuredOutputsParams
    from raygrid.engine.structured_output import GrammarCompiler, grammar_for
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    path = resolve_model_path("random-qwen3-0.6b")
    vocab = load_hf_config(path).vocab_size
    compiler = GrammarCompiler(path, vocab, [1])
    tokenizer = compiler.tokenizer
    words = (vocab + 31) // 32
    count, steps = 256, 20
    print("cpus", os.cpu_count(), flush=True)
    for name, schema in (("endless", ENDLESS), ("bounded", BOUNDED)):
        grammar = grammar_for(StructuredOutputsParams(json=schema))
        for way in ("copies", "fresh", "roots4", "roots12"):
            start = time.perf_counter()
            if way == "fresh":
                matchers = [llguidance.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(count)]
            else:
                k = 1 if way == "copies" else int(way[5:])
                roots = [llguidance.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(k)]
                matchers = [roots[i * k // count].deep_copy() for i in range(count)]
            build = time.perf_counter() - start
            for threads in (1, None) if way == "copies" else (None,):
                executor = llguidance.LLExecutor(num_threads=threads) if threads else llguidance.LLExecutor()
                batch = [m.deep_copy() for m in matchers] if way == "copies" and threads == 1 else matchers
                rng = np.random.default_rng(0)
                fill = consume = 0.0
                for _ in range(steps):
                    mask = np.empty((count, words), dtype=np.int32)
                    start = time.perf_counter()
                    fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(batch)], mask)
                    fill += time.perf_counter() - start
                    tokens = [int(rng.choice(np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab]))) for row in mask]
                    start = time.perf_counter()
                    executor.consume_token_par(list(zip(batch, tokens)))
                    consume += time.perf_counter() - start
                print(name, way, "threads", threads, "build ms", round(build * 1e3, 1), "fill ms", round(fill / steps * 1e3, 3),
                      "consume_par ms", round(consume / steps * 1e3, 3), flush=True)
    compiler.shutdown()


if __name__ == "__main__":
    main()
