"""EngineArgs: the engine's arguments, written once (vLLM's name and fields).

The CLI flags (``EngineArgs.add_cli_args``), the keyword arguments of ``LLM`` and ``AsyncLLM`` and the
resolved ``EngineConfig`` (``create_engine_config``) all come from the fields below, so an argument is
added in one place.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ValidationError

from raygrid.config import DEFAULT_BUDGET, CacheConfig, EngineConfig, EPLBConfig, ModelConfig, ParallelConfig, SchedulerConfig
from raygrid.models.default_model import DEFAULT_MODEL_NAME, is_dummy_built_in, resolve_model_path
from raygrid.validation import InvalidArgument

# The configs' fields that the engine arguments name otherwise (vLLM's argument names).
_ARGUMENT_NAMES = {"cache_dtype": "kv_cache_dtype", "policy": "scheduling_policy"}


def _arg(default, help: str, short: str | None = None):  # noqa: A002 - argparse's word
    return field(default=default, metadata={"help": help, "short": short})


@dataclass
class EngineArgs:
    model: str = _arg(DEFAULT_MODEL_NAME, "checkpoint directory, or a built-in: tiny-random-qwen3, random-qwen3-0.6b, "
                                          "random-llama3-8b, random-qwen3-30b-a3b (random weights: their text is noise)")
    tokenizer: str | None = _arg(None, "tokenizer directory (default: the model's)")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = _arg("auto", "weights and activations")
    device: Literal["auto", "cpu", "cuda"] = _arg("auto", "where the model runs")
    max_model_len: int | None = _arg(None, "longest prompt + output (default: the checkpoint's)")
    max_num_seqs: int = _arg(256, "requests in one step at most")
    max_num_batched_tokens: int | None = _arg(None, f"tokens in one step at most (default {DEFAULT_BUDGET})")
    block_size: int | None = _arg(None, "tokens per KV cache block (default: 64 on a GPU, 16 on CPU)")
    num_kv_blocks: int | None = _arg(None, "fix the KV pool's size (default: sized from memory)")
    enable_prefix_caching: bool = _arg(True, "reuse the KV blocks of earlier requests' shared prefixes")
    prefix_caching_hash_seed: str | None = _arg(None, "fix the root of the prefix-cache block hashes (replicas sharing it "
                                                       "hash alike); default random")
    enable_chunked_prefill: bool = _arg(True, "split long prompts over several steps")
    long_prefill_token_threshold: int = _arg(0, "cap the tokens one prompt takes in a step (0: no cap)")
    scheduling_policy: Literal["fcfs", "priority"] = _arg("fcfs", "which request waits, and which is preempted first")
    async_scheduling: bool | None = _arg(None, "schedule step N+1 while step N runs (default: on GPUs without pipeline stages)")
    gpu_memory_utilization: float = _arg(0.9, "share of GPU memory the engine may take")
    max_logprobs: int = _arg(20, "most logprobs a request may ask for")
    seed: int = _arg(0, "engine seed (weights of dummy loading, noise of unseeded requests)")
    enforce_eager: bool = _arg(False, "no CUDA graphs")
    persistent_decode: bool = _arg(True, "on one GPU, the decode passes of one or two requests as one persistent kernel "
                                         "(dense Llama/Qwen3 without quantization, contexts up to 40,960 tokens "
                                         "together); its sums run in another order, so in 16-bit a request's tokens "
                                         "may differ from the same request's in a larger batch (--no-persistent-decode: "
                                         "the layer-by-layer pass always)")
    load_format: Literal["auto", "dummy"] = _arg("auto", "'dummy': random weights made on the device from config.json alone")
    quantization: Literal["fp8"] | None = _arg(None, "'fp8': linear layers in float8 with per-channel scales, activations "
                                                     "quantized per token (default: what the checkpoint is)")
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = _arg(
        "auto", "'fp8' (or 'fp8_e4m3'): the KV cache in float8 e4m3 with unit scales, half bf16's bytes ('auto': the model's dtype)")
    tensor_parallel_size: int = _arg(1, "GPUs per tensor-parallel group", short="-tp")
    pipeline_parallel_size: int = _arg(1, "pipeline stages", short="-pp")
    data_parallel_size: int = _arg(1, "engine replicas", short="-dp")
    enable_expert_parallel: bool = _arg(False, "MoE experts split over the DP x TP ranks (the DP replicas become one world)")
    custom_all_reduce: bool = _arg(False, "TP all-reduces through raygrid's kernels over NVLink peer buffers (NCCL "
                                          "where the GPUs are not all NVLink peers, and above 8 MiB)")
    enable_eplb: bool = _arg(False, "rebalance experts over the EP ranks by their measured load (needs --enable-expert-parallel)")
    eplb_config: dict | None = _arg(None, "EPLB settings as JSON: window_size, step_interval, num_redundant_experts, log_balancedness")
    distributed_executor_backend: Literal["inprocess", "ray"] | None = _arg(None, "default: ray for more than one device")
    ray_address: str | None = _arg(None, "Ray cluster to join ('auto'); default: start a local one")
    ray_worker_cpus: float = _arg(1.0, "CPUs a worker actor reserves")
    step_timeout_s: float = _arg(300.0, "a step with no progress for this long fails its requests (on Ray: its replica)")
    compiled_graph: bool | None = _arg(None, "on Ray: steps through a Ray Compiled Graph (default: when the workers have GPUs)")
    max_migrations: int = _arg(3, "on Ray: times a request may move to another replica after its own failed (0: it fails)")
    migration_timeout_s: float = _arg(300.0, "on Ray: how long a request may wait for a healthy replica (a rebuild) before it fails")

    # ------------------------------------------------------------------ the CLI

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One flag a field: ``--max-model-len``, ``--enforce-eager/--no-enforce-eager``, ``-tp``..."""
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            flags = [f"--{f.name.replace('_', '-')}"] + ([f.metadata["short"]] if f.metadata.get("short") else [])
            kind = _unwrap(hints[f.name])
            kwargs: dict = dict(dest=f.name, default=f.default, help=f.metadata["help"])
            if kind is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif kind is dict:
                kwargs["type"] = _json_object
            elif typing.get_origin(kind) is Literal:
                kwargs["choices"] = list(typing.get_args(kind))
            else:
                kwargs["type"] = kind
            parser.add_argument(*flags, **kwargs)
        # The older spelling of --no-enable-prefix-caching.
        parser.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", help=argparse.SUPPRESS)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})

    def as_kwargs(self) -> dict:
        return dataclasses.asdict(self)

    # ------------------------------------------------------------------ the engine's configuration

    def parallel_config(self) -> ParallelConfig:
        """The layout these arguments describe (checked: bad values raise an InvalidArgument naming each field)."""
        try:
            eplb_config = EPLBConfig(**(self.eplb_config or {}))
        except ValidationError as error:
            raise InvalidArgument.from_pydantic(error, within="eplb_config") from None
        try:
            return ParallelConfig(tensor_parallel_size=self.tensor_parallel_size, pipeline_parallel_size=self.pipeline_parallel_size,
                                  data_parallel_size=self.data_parallel_size,
                                  enable_expert_parallel=self.enable_expert_parallel, enable_eplb=self.enable_eplb,
                                  custom_all_reduce=self.custom_all_reduce, eplb_config=eplb_config,
                                  distributed_executor_backend=self.distributed_executor_backend, ray_address=self.ray_address,
                                  ray_worker_cpus=self.ray_worker_cpus, step_timeout_s=self.step_timeout_s,
                                  compiled_graph=self.compiled_graph, max_migrations=self.max_migrations,
                                  migration_timeout_s=self.migration_timeout_s)
        except ValidationError as error:
            raise InvalidArgument.from_pydantic(error) from None

    def check(self) -> None:
        """The arguments' own limits, before anything heavy loads (no torch, no checkpoint): a bad value
        raises a ValueError naming the field and its limit. The CLI calls this first, so that a mistyped
        flag is answered in a second; create_engine_config checks them again, with the checkpoint."""
        self._engine_config(self.model, self.load_format)

    def create_engine_config(self) -> EngineConfig:
        """The configuration these arguments describe, resolved against the checkpoint (its context
        length); a bad value raises a ValueError naming the field and its limit."""
        from raygrid.models.layers.fp8 import resolve_quantization
        from raygrid.models.loader import load_hf_config

        model_path = resolve_model_path(self.model)
        load_format = self.load_format
        if load_format == "auto" and is_dummy_built_in(model_path):
            load_format = "dummy"  # a built-in of config and tokenizer only: its weights are made on the device
        config = self._engine_config(model_path, load_format)
        if config.parallel.distributed_executor_backend == "ray":
            # The defaults that depend on the device (page size, async scheduling) follow the workers, which may
            # have GPUs where this process has none. Ray is imported only when asked for.
            from raygrid.placement.placement import workers_device

            config.device = workers_device(config.device, config.parallel.ray_address)
        hf_config = load_hf_config(model_path)
        config.model.quantization = resolve_quantization(self.quantization, hf_config)
        if self.enable_expert_parallel:
            experts = getattr(hf_config, "num_experts", 0) or getattr(hf_config, "num_local_experts", 0)
            if not experts:
                raise ValueError(f"enable_expert_parallel: model {self.model!r} has no experts (a mixture-of-experts model is needed)")
            redundant, ep_size = config.parallel.eplb_config.num_redundant_experts, self.data_parallel_size * self.tensor_parallel_size
            if (experts + redundant) % ep_size:
                raise ValueError(f"eplb_config.num_redundant_experts: num_experts + num_redundant_experts ({experts} + {redundant}) "
                                 f"is not divisible by the expert-parallel size (DP x TP = {ep_size})")
        return config.resolve(hf_config.max_position_embeddings)

    def _engine_config(self, model_path: str, load_format: str) -> EngineConfig:
        """The pydantic configuration of these arguments, each field validated (not yet resolved against a checkpoint);
        bad values raise an InvalidArgument naming each field by its argument name."""
        parallel = self.parallel_config()
        try:
            return EngineConfig(
                model=ModelConfig(model=model_path, tokenizer=self.tokenizer, dtype=self.dtype, max_model_len=self.max_model_len,
                                  max_logprobs=self.max_logprobs, seed=self.seed, enforce_eager=self.enforce_eager,
                                  persistent_decode=self.persistent_decode,
                                  load_format=load_format, quantization=self.quantization),
                cache=CacheConfig(block_size=self.block_size, num_kv_blocks=self.num_kv_blocks,
                                  enable_prefix_caching=self.enable_prefix_caching,
                                  prefix_caching_hash_seed=self.prefix_caching_hash_seed,
                                  gpu_memory_utilization=self.gpu_memory_utilization, cache_dtype=self.kv_cache_dtype),
                scheduler=SchedulerConfig(max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
                                          enable_chunked_prefill=self.enable_chunked_prefill,
                                          long_prefill_token_threshold=self.long_prefill_token_threshold,
                                          policy=self.scheduling_policy, async_scheduling=self.async_scheduling),
                parallel=parallel,
                device=self.device,
            )
        except ValidationError as error:
            raise InvalidArgument.from_pydantic(error, renamed=_ARGUMENT_NAMES) from None


def check_engine_kwargs(kwargs: dict, refused: dict[str, str], where: str) -> None:
    """A config file's ``engine_kwargs``: every key an EngineArgs field, none of those ``refused`` (name -> why,
    said as ``not set {where} (why)``); a ValueError naming the first bad key otherwise."""
    known = {f.name for f in dataclasses.fields(EngineArgs)} - set(refused)
    for key in kwargs:
        if key in refused:
            raise ValueError(f"engine_kwargs.{key}: not set {where} ({refused[key]})")
        if key not in known:
            raise ValueError(f"engine_kwargs.{key}: not an engine argument (known: {', '.join(sorted(known))})")


def _json_object(text: str) -> dict:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _unwrap(hint):
    """The type a flag parses: ``int | None`` -> int, ``bool`` -> bool."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint
