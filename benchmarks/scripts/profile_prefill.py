"""Profile of prefill steps (issue #21's "prefill steps run at twice their compute-bound time"): each step
runs ``--num-reqs`` fresh prompts of ``--prompt-len`` tokens (one token out each, so the step is all prefill),
first timed, then under torch's profiler. Writes the step's wall time, its GPU time by kernel, and the
compute-bound estimate of the step (matmul FLOPs at the chip's dense bf16 rate).

    python benchmarks/scripts/profile_prefill.py OUT.json [--model random-qwen3-0.6b] [--num-reqs 16] [--prompt-len 512]
        [--max-num-batched-tokens N]   # a step's token budget; default: all the prompts in one step

With ``--num-reqs 1 --prompt-len 32768 --max-num-batched-tokens 8192`` it profiles a long prompt's prefill as
``raygrid bench latency`` runs it (the engine's default budget: four chunks of 8,192).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def prefill_flops(hf_config, tokens: int, prompt_len: int) -> float:
    """Matmul FLOPs of a prefill of ``tokens`` tokens in prompts of ``prompt_len``: every linear layer, causal
    attention counted at half, the LM head for one row a prompt."""
    h, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    head_dim = getattr(hf_config, "head_dim", None) or h // heads
    inter = hf_config.intermediate_size
    per_token_linear = h * (heads + 2 * kv_heads) * head_dim + heads * head_dim * h + 3 * h * inter
    attention = 2 * heads * head_dim * prompt_len / 2  # QK^T and PV, causal: per token, over half the prompt
    lm_head = h * hf_config.vocab_size * tokens / prompt_len
    return 2 * (layers * tokens * (per_token_linear + attention) + lm_head)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-reqs", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="a step's token budget (default: the whole batch, at least 8,192)")
    parser.add_argument("--peak-tflops", type=float, default=790.0, help="dense bf16 of the chip (H200: about 790)")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from raygrid import LLM, SamplingParams
    from raygrid.bench.profile_decode import device_busy_us, device_kernels
    from raygrid.bench.throughput import device_name, git_commit
    from raygrid.models.default_model import resolve_model_path
    from raygrid.models.loader import load_hf_config

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    budget = args.max_num_batched_tokens or max(8192, args.num_reqs * args.prompt_len)
    llm = LLM(model=args.model, dtype=args.dtype, max_num_batched_tokens=budget)
    core = llm.engine
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.6, max_tokens=1, ignore_eos=True, detokenize=False)
    counter = iter(range(10**9))

    def prefill_step() -> None:
        for _ in range(args.num_reqs):
            prompt = rng.integers(0, min(10000, llm.processor.vocab_size), args.prompt_len).tolist()  # fresh: the prefix cache never hits
            for child in llm.processor.process(f"p{next(counter)}", {"prompt_token_ids": prompt}, params).children:
                core.add_request(child)
        while core.has_unfinished_requests():
            core.step()

    for _ in range(3):
        prefill_step()
    sync()
    walls = []
    for _ in range(args.steps):
        start = time.perf_counter()
        prefill_step()
        sync()
        walls.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            prefill_step()
        sync()
    kernels = device_kernels(prof, args.steps)
    hf_config = load_hf_config(resolve_model_path(args.model))
    tokens = args.num_reqs * args.prompt_len
    flops = prefill_flops(hf_config, tokens, args.prompt_len)
    bound_ms = flops / (args.peak_tflops * 1e12) * 1e3
    wall_ms = float(np.median(walls)) * 1e3
    gpu_ms = device_busy_us(prof) / args.steps / 1e3
    result = {
        "model": args.model, "num_reqs": args.num_reqs, "prompt_len": args.prompt_len, "tokens": tokens,
        "max_num_batched_tokens": budget,
        "wall_ms_median": wall_ms, "wall_ms_each": [w * 1e3 for w in walls], "gpu_busy_ms": gpu_ms,
        "matmul_tflop": flops / 1e12, "compute_bound_ms": bound_ms, "wall_over_bound": wall_ms / bound_ms,
        "achieved_tflops": flops / (wall_ms / 1e3) / 1e12, "top_kernels": kernels[:30],
        "device": device_name(), "git_commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
    }
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"prefill of {args.num_reqs} x {args.prompt_len}: wall {wall_ms:.2f} ms, GPU busy {gpu_ms:.2f} ms, "
          f"compute bound {bound_ms:.2f} ms ({wall_ms / bound_ms:.2f}x)")
    for k in kernels[:15]:
        print(f"  {k['us_per_step']:9.1f} us ({k['own_us_per_step']:9.1f} own)  x{k['calls_per_step']:5.1f}  {k['name']}")
    llm.shutdown()


if __name__ == "__main__":
    main()
