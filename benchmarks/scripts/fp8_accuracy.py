"""FP8 weights against bf16 and float32 on the same checkpoint, on one GPU.

    python3 benchmarks/scripts/fp8_accuracy.py OUT.json [--model random-qwen3-0.6b] [--num-prompts 64]

Each engine (float32; bfloat16; FP8 weights; an FP8 KV cache; both) scores the same random prompts
(``prompt_logprobs=0``: the log-probability of every prompt token given the ones before) and decodes 8
greedy tokens. Reported: the error of each prompt-token logprob against float32 (mean, p99, max), and
how often each picks float32's first greedy token and all 8.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from raygrid.bench.throughput import provenance
from raygrid.kernels.ops import FP8_FAST_ACCUM


def score(model: str, prompts, **kwargs):
    import torch

    from raygrid import LLM, SamplingParams

    llm = LLM(model=model, max_model_len=1024, **kwargs)
    try:
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, prompt_logprobs=0, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        logprobs = np.array([[entry[tok].logprob for entry, tok in zip(o.prompt_logprobs[1:], p[1:])]
                             for o, p in zip(outs, prompts)])
        return logprobs, [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.shutdown()
        del llm
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--max-token-id", type=int, default=10000, help="prompt ids are drawn below it")
    parser.add_argument("--variants", default=None, help="comma-separated engines to score against float32 (default: all "
                                                         "of bfloat16, fp8, fp8_kv_cache, fp8_and_fp8_kv_cache)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, args.max_token_id, size=args.prompt_len).tolist() for _ in range(args.num_prompts)]
    exact, exact_tokens = score(args.model, prompts, dtype="float32")
    report = {**provenance(), "model": args.model, "num_prompts": args.num_prompts,
              "prompt_len": args.prompt_len, "float32_logprob_mean": float(exact.mean()), "variants": {}}
    all_tokens = {}
    variants = {"bfloat16": {"dtype": "bfloat16"}, "fp8": {"dtype": "bfloat16", "quantization": "fp8"},
                "fp8_kv_cache": {"dtype": "bfloat16", "kv_cache_dtype": "fp8"},
                "fp8_and_fp8_kv_cache": {"dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8"}}
    if args.variants:
        unknown = sorted(set(args.variants.split(",")) - set(variants))
        if unknown:
            parser.error(f"--variants: unknown {unknown}; the variants are {sorted(variants)}")
        variants = {name: variants[name] for name in args.variants.split(",")}
    for name, kwargs in variants.items():
        got, tokens = score(args.model, prompts, **kwargs)
        all_tokens[name] = tokens
        error = np.abs(got - exact)
        report["variants"][name] = {
            "logprob_error_vs_float32": {"mean": float(error.mean()), "p99": float(np.percentile(error, 99)), "max": float(error.max())},
            "first_token_matches_float32": float(np.mean([t[0] == e[0] for t, e in zip(tokens, exact_tokens)])),
            "all_8_tokens_match_float32": float(np.mean([t == e for t, e in zip(tokens, exact_tokens)])),
            "tokens": tokens[:4],
        }
        print(name, json.dumps(report["variants"][name]), flush=True)
    if "fp8" in all_tokens and "bfloat16" in all_tokens:
        fp8, bf16 = all_tokens["fp8"], all_tokens["bfloat16"]
        report["variants"]["fp8"]["first_token_matches_bf16"] = float(np.mean([f[0] == b[0] for f, b in zip(fp8, bf16)]))
    report["fp8_fast_accum"] = FP8_FAST_ACCUM
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
