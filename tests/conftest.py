"""Shared fixtures: tiny real checkpoints (random weights, saved by transformers) with a real tokenizer."""

from __future__ import annotations

import os
import random
import socket
import sys
import time

import pytest
import torch

if not torch.cuda.is_available():
    # Triton kernels run in its interpreter on CPU (must be set before triton is imported).
    os.environ.setdefault("TRITON_INTERPRET", "1")
from transformers import AutoModelForCausalLM, LlamaConfig

from raygrid.models.default_model import build_tokenizer, tiny_qwen3_config, write_random_checkpoint


@pytest.fixture(autouse=True)
def cuda_errors_fail_the_test_that_made_them():
    """On a GPU, wait for the test's kernels at its end: a fault (an illegal address) is asynchronous, and would
    otherwise surface in whichever test next touches the GPU."""
    yield
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="session")
def qwen3_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("ckpt") / "qwen3"
    write_random_checkpoint(path, tiny_qwen3_config(tokenizer), tokenizer, seed=1)
    return str(path)


def tiny_llama_config(tokenizer, **overrides):
    """Llama-3 shaped: GQA, untied LM head, llama3 rope scaling."""
    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        rope_theta=500000.0,
        tie_word_embeddings=False,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        architectures=["LlamaForCausalLM"],
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory, tokenizer):
    """Llama-3 shaped (``tiny_llama_config``), in sharded safetensors."""
    path = tmp_path_factory.mktemp("ckpt") / "llama"
    write_random_checkpoint(path, tiny_llama_config(tokenizer), tokenizer, seed=2, max_shard_size="60KB")
    return str(path)


@pytest.fixture(scope="session")
def llama_wide_heads_dir(tmp_path_factory, tokenizer):
    """``tiny_llama_config`` with heads 16 wide (4 heads, 2 kv heads) rather than 8: the persistent decode pass
    multiplies on tensor cores, which take at least 16."""
    path = tmp_path_factory.mktemp("ckpt") / "llama_wide_heads"
    write_random_checkpoint(path, tiny_llama_config(tokenizer, num_attention_heads=4), tokenizer, seed=4)
    return str(path)


@pytest.fixture(scope="session")
def qwen3_head128_dir(tmp_path_factory, tokenizer):
    """``tiny_qwen3_config`` with Qwen3-0.6B's and Llama-3's head width (2 heads of 128, 1 kv head): on Hopper a long
    prompt's attention takes the Gluon kernel, which only takes heads of 128."""
    path = tmp_path_factory.mktemp("ckpt") / "qwen3_head128"
    write_random_checkpoint(path, tiny_qwen3_config(tokenizer, num_attention_heads=2, num_key_value_heads=1, head_dim=128),
                            tokenizer, seed=5)
    return str(path)


def tiny_qwen3_moe_config(tokenizer):
    """8 experts, top-2, renormalized; layer 1 of 3 is dense (mlp_only_layers), the others sparse."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
        max_position_embeddings=2048, tie_word_embeddings=False, initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3MoeForCausalLM"],
    )


@pytest.fixture(scope="session")
def qwen3_moe_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("ckpt") / "qwen3_moe"
    write_random_checkpoint(path, tiny_qwen3_moe_config(tokenizer), tokenizer, seed=3)
    return str(path)


@pytest.fixture(scope="session")
def model_dirs(qwen3_dir, llama_dir):
    return {"qwen3": qwen3_dir, "llama": llama_dir}


def random_prompts(count: int, vocab_size: int, min_len: int = 3, max_len: int = 70, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    # Skip the special tokens at the start of the vocabulary.
    return [[rng.randrange(3, vocab_size) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int, **generate_kwargs) -> list[list[int]]:
    """Hugging Face transformers' own greedy generation, one prompt at a time, never stopping early
    (``generate_kwargs`` such as repetition_penalty go to ``generate``)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 min_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, **generate_kwargs)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


# ---------------------------------------------------------------------- one local Ray cluster for the session


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RAY_METRICS_PORT = free_port()  # Ray's metrics endpoint on the session cluster's node
RAY_DASHBOARD_PORT = free_port()  # its dashboard: the job server


def start_local_ray() -> None:
    import ray

    # Logical CPUs: the workers of a TP=2 x PP=2 replica and the Serve replicas need more slots than this
    # machine has cores.
    ray.init(num_cpus=16, include_dashboard=True, dashboard_port=RAY_DASHBOARD_PORT, log_to_driver=False,
             _metrics_export_port=RAY_METRICS_PORT)


def free_cpus_once_settled(settle_s: float = 30.0, after: str = "") -> float:
    """The session cluster's free CPUs, waiting up to ``settle_s`` for what earlier tests released to come back.

    A test that must fill the cluster asks for this rather than the 16 CPUs the session starts with. Ray has been
    seen (once in CI, at the start of tests/test_migration.py's second test) to keep 2 CPUs held for minutes with
    no placement group left; a warning then names the live actors (and ``after``: where the check was made), so
    the holder shows in the output."""
    import warnings

    import ray
    from ray.util.state import list_actors

    total, deadline = ray.cluster_resources().get("CPU", 0.0), time.monotonic() + settle_s
    while (free := ray.available_resources().get("CPU", 0.0)) < total and time.monotonic() < deadline:
        time.sleep(0.25)
    if free < total:
        try:
            alive = [(a.class_name, a.pid, a.required_resources) for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True)]
        except Exception as error:  # noqa: BLE001 - the warning is a diagnosis; the test goes on with what is free
            alive = f"unknown (Ray's state API: {error})"
        where = f" after {after}" if after else ""
        warnings.warn(f"{total - free:g} of the cluster's {total:g} CPUs still held {settle_s:g} s{where}; live actors: {alive}")
    return free


@pytest.fixture(scope="module", autouse=True)
def cluster_whole_after_each_module(request):
    """After a module's tests and its fixtures (an autouse fixture is torn down last): a warning naming the module
    and the live actors when the Ray cluster's CPUs are not all free within 10 s. A leak then shows where it
    began, not only in whichever test next fills the cluster."""
    yield
    ray = sys.modules.get("ray")  # a module that never imported Ray has nothing to check
    if ray is not None and ray.is_initialized() and ray.available_resources().get("CPU", 0.0) != _LEFT_HELD[0]:
        # (A hold already reported is not waited for again after every later module.)
        free = free_cpus_once_settled(settle_s=10.0, after=request.module.__name__)
        _LEFT_HELD[0] = free if free < ray.cluster_resources().get("CPU", 0.0) else None


_LEFT_HELD: list[float | None] = [None]  # the free CPUs of the last hold reported after a module


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's local Ray cluster (started on first use; tests/test_multinode.py borrows the session
    for a two-node cluster and starts this one again after)."""
    import ray

    if not ray.is_initialized():
        start_local_ray()
    yield  # its address: ray.get_runtime_context().gcs_address, read when needed (a restart changes it)
    ray.shutdown()
