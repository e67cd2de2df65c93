"""Loads a Hugging Face checkpoint directory: config.json, (sharded) safetensors, into our model."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from raygrid.models.registry import resolve_model_class

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_config(model_dir: str):
    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model {model_dir!r}: no config.json there (expected a Hugging Face checkpoint directory)")
    return AutoConfig.from_pretrained(model_dir)


def resolve_dtype(dtype: str, hf_config, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return _DTYPES[dtype]
    checkpoint_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(checkpoint_dtype, str):
        checkpoint_dtype = _DTYPES.get(checkpoint_dtype)
    if checkpoint_dtype not in _DTYPES.values():
        checkpoint_dtype = torch.float32
    if device.type == "cpu" and checkpoint_dtype == torch.float16:
        return torch.bfloat16  # float16 matmuls are slow or missing on many CPUs
    return checkpoint_dtype


def safetensors_files(model_dir: str) -> list[Path]:
    path = Path(model_dir)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model {model_dir!r}: no *.safetensors files")
    return files


class CheckpointTensor:
    """A tensor of a safetensors file, read lazily: ``narrow`` reads only the slice asked for, so a
    tensor-parallel rank never holds the whole tensor in memory."""

    def __init__(self, safe_slice) -> None:
        self._slice = safe_slice
        self.shape = tuple(safe_slice.get_shape())
        self.is_fp8 = safe_slice.get_dtype().startswith("F8")

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        if not self.shape:  # a scalar (a per-tensor scale)
            return self._slice[...]
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + size)
        return self._slice[tuple(index)]


def iterate_weights(model_dir: str) -> Iterator[tuple[str, CheckpointTensor]]:
    """Checkpoint tensors one at a time (valid until the next one is asked for)."""
    for file in safetensors_files(model_dir):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, CheckpointTensor(f.get_slice(name))


def load_model(model_dir: str, hf_config, dtype: torch.dtype, device: torch.device, load_format: str = "auto",
               seed: int = 0, quantization: str | None = None) -> torch.nn.Module:
    """The model of a checkpoint directory on ``device``; with ``quantization="fp8"`` its linear layers hold float8
    weights, read as such from an FP8 checkpoint or quantized after loading an unquantized one."""
    from raygrid.models.layers import fp8
    model_cls = resolve_model_class(hf_config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(hf_config)
    finally:
        torch.set_default_dtype(previous)
    # Rotary tables stay float32: they are cast per use, as transformers does.
    for module in model.modules():
        if hasattr(module, "cos_cache"):
            module.float()
    fp8_checkpoint = getattr(hf_config, "quantization_config", None) is not None and load_format != "dummy"
    if quantization == "fp8" and fp8_checkpoint:
        fp8.prepare_for_fp8_checkpoint(model)
    weights = dummy_weights(hf_config, dtype, device, seed) if load_format == "dummy" else iterate_weights(model_dir)
    loaded = model.load_weights(weights)
    missing = model.expected_loads() - loaded
    if missing:
        raise ValueError(f"model {model_dir!r}: checkpoint lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")
    if quantization == "fp8" and not fp8_checkpoint:
        fp8.quantize_model(model)
    return model.eval()


class DummyTensor:
    """A made-up checkpoint tensor with CheckpointTensor's interface, drawn on ``narrow`` from a generator
    keyed by its name: norms 1, everything else normal(0, std)."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, std: float, seed: int) -> None:
        self.name, self.shape, self.dtype, self.device, self.std, self.seed = name, shape, dtype, device, std, seed
        self._full: torch.Tensor | None = None

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        if self._full is None:
            self._full = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            if self.name.endswith("norm.weight"):
                self._full.fill_(1.0)
            else:
                generator = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + zlib.crc32(self.name.encode()))
                self._full.normal_(0.0, self.std, generator=generator)
        return self._full.narrow(dim, start, size)


def dummy_weights(hf_config, dtype: torch.dtype, device: torch.device, seed: int) -> Iterator[tuple[str, DummyTensor]]:
    """``load_format="dummy"``, as vLLM's, but the same model under every layout: the checkpoint's tensors
    (the names and shapes transformers gives this config) made up one at a time, each from its own name's
    generator, and loaded through the model's own loaders, so a tensor-parallel rank or a pipeline stage
    takes its part of the very tensors one device would hold. A tensor no rank of this layout asks for is
    never drawn; a 30B model loads in seconds with no checkpoint written or read."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(hf_config)
    std = getattr(hf_config, "initializer_range", 0.02)
    for name, param in reference.named_parameters():
        yield name, DummyTensor(name, tuple(param.shape), dtype, device, std, seed)
