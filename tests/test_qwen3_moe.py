"""Qwen3-MoE against transformers on the same tiny random checkpoint (8 experts, top-2, float32, CPU):
greedy tokens identical with prefix caching, chunked prefill and preemption on, logprobs within 1e-4, and
the packed expert layout of recent transformers loading to the same model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from raygrid import LLM, SamplingParams
from tests.conftest import hf_greedy, random_prompts

MAX_NEW_TOKENS = 16
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)


@pytest.fixture(scope="module")
def case(qwen3_moe_dir, tokenizer):
    # Pairs of prompts that share a 40-token prefix: the second of each pair hits the prefix cache.
    heads = random_prompts(4, len(tokenizer), min_len=40, max_len=40, seed=31)
    tails = random_prompts(8, len(tokenizer), min_len=3, max_len=30, seed=32)
    prompts = [heads[i // 2] + tails[i] for i in range(8)]
    return prompts, hf_greedy(qwen3_moe_dir, prompts, MAX_NEW_TOKENS)


def greedy(model_dir, prompts, **engine_kwargs):
    llm = LLM(model=model_dir, dtype="float32", device="cpu", max_model_len=256, **engine_kwargs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    return llm, [o.outputs[0].token_ids for o in outputs]


def test_greedy_matches_transformers_with_caching_chunking_and_preemption(qwen3_moe_dir, case):
    prompts, expected = case
    _, got = greedy(qwen3_moe_dir, prompts)
    assert got == expected
    # 24 usable blocks for 8 requests of up to 86 tokens, prefill chunks of 32 tokens, prefix caching on.
    llm, got = greedy(qwen3_moe_dir, prompts, num_kv_blocks=25, max_num_batched_tokens=32)
    stats = llm.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert got == expected


def test_logprobs_match_transformers(qwen3_moe_dir, case):
    prompt = case[0][3]
    llm = LLM(model=qwen3_moe_dir, dtype="float32", device="cpu", max_model_len=256)
    completion = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=6, logprobs=3, ignore_eos=True),
                              use_tqdm=False)[0].outputs[0]
    model = AutoModelForCausalLM.from_pretrained(qwen3_moe_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion.token_ids])).logits[0]
    reference = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    for step, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        for candidate in reference[step].topk(3).indices.tolist():
            assert entry[candidate].logprob == pytest.approx(reference[step, candidate].item(), abs=1e-4)


def test_the_packed_expert_layout_loads_the_same_model(qwen3_moe_dir, case, tmp_path):
    """Recent transformers holds experts packed (experts.gate_up_proj [E, 2I, H], experts.down_proj
    [E, H, I]); a checkpoint written that way gives the same tokens."""
    packed_dir = tmp_path / "packed"
    shutil.copytree(qwen3_moe_dir, packed_dir)
    (packed_dir / "model.safetensors").unlink()
    with safe_open(str(Path(qwen3_moe_dir) / "model.safetensors"), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    config = json.loads((packed_dir / "config.json").read_text())
    packed = {name: t for name, t in tensors.items() if ".experts." not in name}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        if f"{prefix}.0.gate_proj.weight" not in tensors:
            continue  # a dense layer
        experts = range(config.get("num_experts") or config["num_local_experts"])  # the key differs across versions
        packed[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([tensors[f"{prefix}.{e}.gate_proj.weight"], tensors[f"{prefix}.{e}.up_proj.weight"]]) for e in experts])
        packed[f"{prefix}.down_proj"] = torch.stack([tensors[f"{prefix}.{e}.down_proj.weight"] for e in experts])
    save_file(packed, str(packed_dir / "model.safetensors"), metadata={"format": "pt"})
    prompts, expected = case
    _, got = greedy(str(packed_dir), prompts[:3])
    assert got == expected[:3]
    # A checkpoint that lacks an expert's tensor is refused, naming what is missing.
    del packed["model.layers.0.mlp.experts.down_proj"]
    save_file(packed, str(packed_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="checkpoint lacks"):
        LLM(model=str(packed_dir), dtype="float32", device="cpu", max_model_len=256)


def test_dummy_load_format_needs_only_the_config(qwen3_moe_dir, case, tmp_path):
    """load_format="dummy" makes seeded random weights from config.json alone: no safetensors needed, the
    same seed gives the same model, and it is not the checkpoint's model."""
    config_only = tmp_path / "config_only"
    shutil.copytree(qwen3_moe_dir, config_only, ignore=shutil.ignore_patterns("*.safetensors"))
    prompts, from_checkpoint = case
    _, first = greedy(str(config_only), prompts[:2], load_format="dummy")
    _, again = greedy(str(config_only), prompts[:2], load_format="dummy")
    assert first == again and first != from_checkpoint[:2]
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(model=str(config_only), dtype="float32", device="cpu", max_model_len=256)


def test_the_big_built_ins_are_configs_that_load_dummy(tmp_path, monkeypatch):
    """random-qwen3-30b-a3b (Qwen3-30B-A3B's shape) and random-llama3-8b (Llama-3-8B's) are a config and a
    tokenizer that has every id, with no weights on disk; the engine arguments turn dummy loading on for them."""
    from raygrid.engine.input_processor import build_engine_config
    from raygrid.models.loader import load_hf_config

    monkeypatch.setenv("RAYGRID_CACHE", str(tmp_path))
    shapes = {}
    for name in ("random-qwen3-30b-a3b", "random-llama3-8b"):
        config = build_engine_config(name, device="cpu", max_model_len=4096)
        assert config.model.load_format == "dummy"
        assert not list(Path(config.model.model).glob("*.safetensors"))
        hf = load_hf_config(config.model.model)
        shapes[name] = (hf.architectures[0], hf.hidden_size, hf.num_hidden_layers, hf.num_attention_heads, hf.num_key_value_heads,
                        hf.head_dim, hf.intermediate_size, hf.vocab_size, hf.tie_word_embeddings)
        assert len(AutoTokenizer.from_pretrained(config.model.model)) == hf.vocab_size
    assert shapes["random-llama3-8b"] == ("LlamaForCausalLM", 4096, 32, 32, 8, 128, 14336, 128256, False)
    assert shapes["random-qwen3-30b-a3b"][:6] == ("Qwen3MoeForCausalLM", 2048, 48, 32, 4, 128)
    hf = load_hf_config(build_engine_config("random-qwen3-30b-a3b", device="cpu", max_model_len=4096).model.model)
    assert (hf.num_experts, hf.num_experts_per_tok, hf.moe_intermediate_size, hf.vocab_size) == (128, 8, 768, 151936)
