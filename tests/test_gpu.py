"""GPU path (Triton kernels, CUDA graphs) against transformers and against the CPU path.
Runs on the device machine; on a machine without CUDA these tests are skipped."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run on the device machine")

MAX_NEW = 16


def greedy(logprobs=None):
    return SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=logprobs)


def run(model_dir, prompts, **kwargs):
    llm = LLM(model=model_dir, max_model_len=512, gpu_memory_utilization=0.3, **kwargs)
    try:
        return llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(logprobs=5), use_tqdm=False)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_bf16_first_tokens_and_logits_match_transformers(model_dirs, tokenizer, model):
    prompts = random_prompts(8, len(tokenizer), seed=31)
    outputs = run(model_dirs[model], prompts, device="cuda", dtype="bfloat16")
    hf = AutoModelForCausalLM.from_pretrained(model_dirs[model], dtype=torch.bfloat16).cuda().eval()
    worst = 0.0
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            logits = hf(torch.tensor([prompt], device="cuda")).logits[0, -1].float()
            reference = torch.log_softmax(logits, dim=-1)
            first = out.outputs[0].logprobs[0]
            assert out.outputs[0].token_ids[0] == int(reference.argmax()) or reference.topk(2).values.diff().abs().item() < 0.05
            for token_id, lp in first.items():
                ref = reference[token_id].item()
                # bf16 keeps about 3 significant digits: allow 2% of the value (at least 0.02).
                worst = max(worst, abs(lp.logprob - ref) / max(abs(ref), 1.0))
    assert worst < 0.02, f"logprobs differ by {worst:.2%} (relative) from transformers (bf16)"


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_gpu_float32_matches_cpu_path(model_dirs, tokenizer, model):
    prompts = random_prompts(8, len(tokenizer), seed=32)
    gpu = run(model_dirs[model], prompts, device="cuda", dtype="float32")
    cpu = run(model_dirs[model], prompts, device="cpu", dtype="float32")
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]


def test_cuda_graphs_match_eager(model_dirs, tokenizer):
    prompts = random_prompts(12, len(tokenizer), seed=33)
    graphs = run(model_dirs["qwen3"], prompts, device="cuda", dtype="bfloat16")
    eager = run(model_dirs["qwen3"], prompts, device="cuda", dtype="bfloat16", enforce_eager=True)
    assert [o.outputs[0].token_ids for o in graphs] == [o.outputs[0].token_ids for o in eager]
