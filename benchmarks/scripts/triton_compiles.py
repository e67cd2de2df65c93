"""Which Triton kernel variants an engine compiles, and when: at start, in the benchmark's warm-up, or during
the run, where a user's requests wait for them; then for requests with each sampling feature alone, and grammars.
Run it with an empty TRITON_CACHE_DIR to see a fresh machine.

    TRITON_CACHE_DIR=$(mktemp -d) python3 benchmarks/scripts/triton_compiles.py OUT.json [--model M] [engine args]

A variant is one (kernel, specialization, launch options): Triton compiles one for each integer argument that
is 1 or not, divisible by 16 or not, and for each constexpr value. Every variant this process builds is
logged by `triton.knobs.runtime.jit_cache_hook` (called before a compile, whether the disk cache then has it or
not) and timed to `jit_post_compile_hook`. The workload is W1's (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter

from triton import knobs

from raygrid.bench.throughput import make_workload, provenance

# Requests of the "features" phase: each sampling feature alone (the engine's warm-up samples with all of them on,
# and by temperature alone), and a grammar.
FEATURES = [dict(temperature=0.0), dict(temperature=0.8, top_k=20), dict(temperature=0.8, top_p=0.9),
            dict(temperature=0.8, min_p=0.1), dict(temperature=0.8, repetition_penalty=1.2),
            dict(temperature=0.8, frequency_penalty=0.5, presence_penalty=0.5), dict(temperature=0.8, logprobs=5),
            dict(temperature=0.8, seed=7), dict(temperature=0.8, logit_bias={5: 2.0}),
            dict(temperature=0.0, structured_outputs={"regex": "[a-z]{1,12}"}),
            dict(temperature=0.8, structured_outputs={"choice": ["yes", "no"]}, max_tokens=4)]
EVENTS: list[dict] = []
PHASE = {"name": "start", "t0": time.perf_counter()}


def _before(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    EVENTS.append({"phase": PHASE["name"], "kernel": fn.name, "variant": repr, "key": str(key),
                   "at_s": time.perf_counter() - PHASE["t0"], "began": time.perf_counter()})
    return None  # None: go on and compile


def _after(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    for event in reversed(EVENTS):
        if event["variant"] == repr and "compile_s" not in event:
            event["compile_s"] = time.perf_counter() - event.pop("began")
            break
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_json")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--random-range", type=int, nargs=2, default=(100, 1024))
    parser.add_argument("--engine-args", default="{}", help="JSON of further LLM arguments")
    args = parser.parse_args()
    knobs.runtime.jit_cache_hook = _before
    knobs.runtime.jit_post_compile_hook = _after

    from raygrid import LLM, SamplingParams
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    model_path = resolve_model_path(args.model)
    prompts, output_lens = make_workload(args.num_prompts, None, None, args.random_range, 0,
                                         load_hf_config(model_path).vocab_size)
    longest = max(len(p) + n for p, n in zip(prompts, output_lens))
    walls = {}
    t = time.perf_counter()
    llm = LLM(model=model_path, dtype=args.dtype, max_model_len=max(longest, 2048), **json.loads(args.engine_args))
    walls["start"] = time.perf_counter() - t
    try:
        PHASE.update(name="warmup", t0=time.perf_counter())  # bench throughput's warm-up
        llm.generate([{"prompt_token_ids": p[:16]} for p in prompts[:4]],
                     SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False), use_tqdm=False)
        walls["warmup"] = time.perf_counter() - PHASE["t0"]
        PHASE.update(name="run", t0=time.perf_counter())
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               [SamplingParams(temperature=0.6, max_tokens=n, ignore_eos=True, detokenize=False)
                                for n in output_lens], use_tqdm=False)
        walls["run"] = time.perf_counter() - PHASE["t0"]
        generated = sum(len(o.outputs[0].token_ids) for o in outputs)
        # Then one request for each sampling feature alone, and a grammar: W1 samples by temperature only.
        PHASE.update(name="features", t0=time.perf_counter())
        llm.generate([{"prompt_token_ids": p[:64]} for p in prompts[:len(FEATURES)]],
                     [SamplingParams(**{"max_tokens": 8, **feature}) for feature in FEATURES], use_tqdm=False)
        walls["features"] = time.perf_counter() - PHASE["t0"]
    finally:
        llm.shutdown()
    for event in EVENTS:
        event.pop("began", None)
    by_phase = {phase: [e for e in EVENTS if e["phase"] == phase] for phase in walls}
    summary = {phase: {"wall_s": round(walls[phase], 3), "variants": len(events),
                       "compile_s": round(sum(e.get("compile_s", 0.0) for e in events), 3),
                       "kernels": dict(Counter(e["kernel"] for e in events))}
               for phase, events in by_phase.items()}
    summary["run"]["output_tok_s"] = round(generated / walls["run"], 1)
    with open(args.output_json, "w") as f:
        json.dump({**provenance(), "args": vars(args), "summary": summary, "events": EVENTS}, f, indent=1)
    print(json.dumps(summary, indent=1))
    for event in by_phase["warmup"] + by_phase["run"] + by_phase["features"]:
        earlier = [e for e in EVENTS[:EVENTS.index(event)] if e["kernel"] == event["kernel"]]
        print(f"{event['phase']} +{event['at_s']:.2f} s, {event.get('compile_s', 0):.2f} s: {event['kernel']}\n  key {event['key']}")
        for e in earlier:
            print(f"  an earlier variant ({e['phase']}): {e['key']}")


if __name__ == "__main__":
    main()
