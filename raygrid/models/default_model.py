"""The built-in model ``tiny-random-qwen3``: a tiny Qwen3-shaped checkpoint with random weights and a
real byte-level BPE tokenizer, written on first use to a cache directory and then loaded through the
normal checkpoint path. It lets a fresh machine run raygrid end to end with no download.
Its weights are random, so the text it writes is noise.

The same builders make the tiny checkpoints of the tests.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

DEFAULT_MODEL_NAME = "tiny-random-qwen3"
# Qwen3-0.6B's shape with random bf16 weights: the model of the speed benchmarks (no download needed).
BENCH_MODEL_NAME = "random-qwen3-0.6b"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen's ChatML with Hermes-style tools: the tool signatures go into a system block, an assistant's calls are
# written as <tool_call>{"name": ..., "arguments": ...}</tool_call>, and tool results come back as user turns.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nThese functions are available; their signatures are inside <tools></tools>:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nTo call one, write its name and arguments as JSON inside <tool_call></tool_call>:\n"
    "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and tools and loop.first %}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + (message['content'] or '') + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '\n<tool_call>\n{\"name\": \"' + fn['name'] + '\", \"arguments\": ' }}"
    "{{- fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) }}"
    "{{- '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)


def cache_dir() -> Path:
    return Path(os.environ.get("RAYGRID_CACHE", Path.home() / ".cache" / "raygrid"))


# Bumped when a built-in's files change: a cached copy of an older version is made again.
BUILT_IN_VERSION = "3"  # 2: the tokenizers cover the whole vocabulary; 3: the chat template renders tools


def resolve_model_path(model: str) -> str:
    """A checkpoint directory for ``model``: a built-in name is created on first use."""
    if model in BUILT_IN_MODELS:
        path = cache_dir() / "models" / model
        marker = path / "raygrid-built-in-version"
        if not marker.is_file() or marker.read_text() != BUILT_IN_VERSION:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Processes of one node (Serve replicas, workers) may start together: one writes, the others wait.
            with open(path.parent / f".{model}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not marker.is_file() or marker.read_text() != BUILT_IN_VERSION:
                    print(f"raygrid: creating the built-in model {model} (random weights, its text is noise) in {path}", flush=True)
                    BUILT_IN_MODELS[model](path)
                    marker.write_text(BUILT_IN_VERSION)
        return str(path)
    if not Path(model).is_dir():
        raise FileNotFoundError(
            f"model {model!r} is not a checkpoint directory; raygrid loads local Hugging Face checkpoints "
            f"(config.json + *.safetensors + tokenizer files) or the built-in {DEFAULT_MODEL_NAME!r}"
        )
    return model


def build_tokenizer(vocab_size: int = 1024):
    """A byte-level BPE tokenizer with Qwen-style chat tokens and exactly ``vocab_size`` ids: merges trained on
    a small bundled corpus, then made-up merges of printable characters until every id of the vocabulary
    is a real token (so a model with Qwen3's 151,936 ids decodes every id it samples to text, as real
    models do, and serving benchmarks pay for detokenization)."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = resources.files("raygrid.models").joinpath("assets/tokenizer_corpus.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 1024),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        spec = json.loads(tok.to_str())
        _fill_vocabulary(spec["model"], vocab_size)
        tok = Tokenizer.from_str(json.dumps(spec))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _fill_vocabulary(bpe: dict, vocab_size: int) -> None:
    """Append merges to a BPE model's ``vocab`` and ``merges`` until it has ``vocab_size`` tokens: every pair
    of printable characters (byte-level spelling, so a space is 'Ġ'), then pairs followed by a character."""
    vocab, merges = bpe["vocab"], bpe["merges"]
    chars = ["Ġ" if c == " " else c for c in map(chr, range(32, 127))]

    def add(left: str, right: str) -> bool:
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            merges.append([left, right])
        return len(vocab) >= vocab_size

    pairs = [a + b for a in chars for b in chars]
    for pair in pairs:
        if add(pair[0], pair[1]):
            return
    for pair in pairs:
        for c in chars:
            if add(pair, c):
                return
    raise ValueError(f"vocab_size {vocab_size} is more than the made-up merges reach ({len(vocab)})")


def write_random_checkpoint(path: Path, hf_config, tokenizer, seed: int = 0, dtype=None, max_shard_size: str | None = None) -> None:
    """Save a randomly initialised transformers model of ``hf_config`` with ``tokenizer`` into ``path``."""
    import torch
    from transformers import AutoModelForCausalLM

    def write(tmp: Path) -> None:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config)
        if dtype is not None:
            model = model.to(dtype)
        model.save_pretrained(tmp, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
        tokenizer.save_pretrained(tmp)

    _write_atomically(Path(path), write)


def write_config_only(path: Path, hf_config, tokenizer) -> None:
    """config.json and the tokenizer, no weights (for ``load_format="dummy"``)."""

    def write(tmp: Path) -> None:
        hf_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    _write_atomically(Path(path), write)


def _write_atomically(path: Path, write) -> None:
    """``write`` into a temporary directory beside ``path``, then rename it: a half-written checkpoint is
    never seen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}-"))
    try:
        write(tmp)
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def tiny_qwen3_config(tokenizer, **overrides):
    from transformers import Qwen3Config

    fields = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        architectures=["Qwen3ForCausalLM"],
    )
    fields.update(overrides)
    return Qwen3Config(**fields)


def qwen3_0_6b_config(tokenizer):
    """Qwen3-0.6B's architecture (hidden 1024, 28 layers, 16 heads, 8 kv heads, head_dim 128,
    intermediate 3072, vocabulary 151936, tied embeddings), with a tokenizer that has every id."""
    return tiny_qwen3_config(
        tokenizer,
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
        initializer_range=0.02,
    )


def qwen3_30b_a3b_config(tokenizer):
    """Qwen3-30B-A3B's architecture (hidden 2048, 48 layers, 32 heads / 4 kv heads, head_dim 128, 128 experts,
    top-8, moe_intermediate 768, vocabulary 151936): 61 GB of bf16, so its weights are never written;
    ``load_format="dummy"`` makes them on the device."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, initializer_range=0.02, dtype="bfloat16",
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, architectures=["Qwen3MoeForCausalLM"],
    )


def llama3_8b_config(tokenizer):
    """Llama-3-8B's architecture (hidden 4096, 32 layers, 32 heads / 8 kv heads, intermediate 14336,
    vocabulary 128256, untied head): 16 GB of bf16, so its weights are never written; ``load_format="dummy"``
    makes them on the device (normal(0, 0.02), norms 1)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, initializer_range=0.02, dtype="bfloat16", attention_bias=False, mlp_bias=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, architectures=["LlamaForCausalLM"],
    )


def load_dummy_qwen3_0_6b(device, dtype=None):
    """Qwen3-0.6B's shape (``qwen3_0_6b_config``) with random weights made on ``device`` (``load_format="dummy"``), in
    bf16 unless ``dtype`` says otherwise: no weights are written, only the config and tokenizer, to a directory that is
    gone when it returns. For benchmark scripts that time the model's own pass."""
    import torch

    from raygrid.models.loader import load_model

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(vocab_size=151936)
        config = qwen3_0_6b_config(tokenizer)
        write_config_only(Path(tmp), config, tokenizer)
        return load_model(tmp, config, dtype or torch.bfloat16, device, load_format="dummy")


def build_llama_bench_model(path: Path) -> None:
    tokenizer = build_tokenizer(vocab_size=128256)
    write_config_only(path, llama3_8b_config(tokenizer), tokenizer)


def build_moe_bench_model(path: Path) -> None:
    tokenizer = build_tokenizer(vocab_size=151936)
    write_config_only(path, qwen3_30b_a3b_config(tokenizer), tokenizer)


def build_default_model(path: Path) -> None:
    tokenizer = build_tokenizer()
    write_random_checkpoint(path, tiny_qwen3_config(tokenizer), tokenizer, seed=0)


def build_bench_model(path: Path) -> None:
    import torch

    tokenizer = build_tokenizer(vocab_size=151936)
    write_random_checkpoint(path, qwen3_0_6b_config(tokenizer), tokenizer, seed=0, dtype=torch.bfloat16)


MOE_BENCH_MODEL_NAME = "random-qwen3-30b-a3b"
# Llama-3-8B's shape: the model of the multi-GPU benchmarks.
LLAMA_BENCH_MODEL_NAME = "random-llama3-8b"
BUILT_IN_MODELS = {DEFAULT_MODEL_NAME: build_default_model, BENCH_MODEL_NAME: build_bench_model,
                   MOE_BENCH_MODEL_NAME: build_moe_bench_model, LLAMA_BENCH_MODEL_NAME: build_llama_bench_model}
# Built-ins with no weights on disk: they load with load_format="dummy".
DUMMY_BUILT_INS = frozenset({MOE_BENCH_MODEL_NAME, LLAMA_BENCH_MODEL_NAME})


def is_dummy_built_in(model_path: str) -> bool:
    """Is this directory the cached copy of a built-in that has no weights (by name or by its path)?"""
    path = Path(model_path)
    return path.name in DUMMY_BUILT_INS and path.parent == cache_dir() / "models"
