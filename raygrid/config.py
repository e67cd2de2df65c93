"""Engine configuration: what the model is, how the KV cache is laid out, how the scheduler batches.

Every field is validated by pydantic, so a bad value fails with an error that names the field and the
limit before any weights are loaded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from raygrid.parallel.rank_grid import RankGrid

DType = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "cuda"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(_Strict):
    model: str = Field(description="checkpoint directory, or the built-in name 'tiny-random-qwen3'")
    tokenizer: str | None = Field(default=None, description="tokenizer directory; defaults to `model`")
    dtype: DType = "auto"
    max_model_len: int | None = Field(default=None, ge=2, description="context length; defaults to the checkpoint's")
    max_logprobs: int = Field(default=20, ge=0, description="the most top logprobs a request may ask for")
    seed: int = 0
    enforce_eager: bool = Field(default=False, description="no CUDA graphs: every step runs eagerly")
    persistent_decode: bool = Field(
        default=True,
        description="on one GPU, the decode passes of one or two requests as one persistent kernel where the model allows")
    load_format: Literal["auto", "dummy"] = Field(
        default="auto", description="'dummy': random weights made on the device from config.json alone, no checkpoint read")
    quantization: Literal["fp8"] | None = Field(
        default=None, description="'fp8': linear layers in float8 with per-channel scales (an FP8 checkpoint sets it)")


# KV block (page) sizes by device. On a GPU a 64-token page holds whole 64-key tiles of the prefill kernel,
# which then reads each by one bulk copy (TMA): 11 to 14% faster than gathering 16-token pages' rows
# (benchmarks/README.md, "Prefill attention by bulk copies").
GPU_BLOCK_SIZE = 64
CPU_BLOCK_SIZE = 16
DEFAULT_BUDGET = 8192  # a step's tokens (max_num_batched_tokens) when unset


class CacheConfig(_Strict):
    block_size: int | None = Field(
        default=None, ge=1, le=1024,
        description="tokens per KV block; default GPU_BLOCK_SIZE on a GPU (the prefill kernel's bulk copies), 16 on CPU")
    num_kv_blocks: int | None = Field(default=None, ge=2, description="fixed KV pool size; sized from memory if unset")
    enable_prefix_caching: bool = True
    prefix_caching_hash_seed: str | None = Field(
        default=None, description="fixes the root of the prefix-cache hashes (replicas that share it hash alike); default random"
    )
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    cache_dtype: Literal["auto", "fp8", "fp8_e4m3"] = Field(
        default="auto", description="'auto': the model's dtype; 'fp8' (or 'fp8_e4m3'): float8 e4m3 with unit scales")
    cpu_kv_cache_space_gib: float = Field(default=1.0, gt=0.0, description="KV pool size on CPU when unset")


class SchedulerConfig(_Strict):
    max_num_seqs: int = Field(default=256, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = Field(default=0, ge=0, description="cap on one prefill chunk; 0 is no cap")
    policy: Literal["fcfs", "priority"] = "fcfs"
    # Schedule step N+1 while step N runs on the device; its inputs then include tokens the host has
    # not seen yet (placeholders). Default: on for GPUs without pipeline stages, off otherwise.
    async_scheduling: bool | None = None


class EPLBConfig(_Strict):
    """The expert-parallel load balancer (vLLM's ``eplb_config``)."""
    window_size: int = Field(default=1000, ge=1, description="steps of expert load the rebalancer looks back over")
    step_interval: int = Field(default=3000, ge=1, description="steps between two rebalances")
    num_redundant_experts: int = Field(default=0, ge=0, description="extra physical expert slots, for replicas of hot experts")
    log_balancedness: bool = Field(default=False, description="log each step's balancedness (mean / max tokens per EP rank)")


class ParallelConfig(_Strict):
    tensor_parallel_size: int = Field(default=1, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    data_parallel_size: int = Field(default=1, ge=1)
    enable_expert_parallel: bool = Field(
        default=False, description="MoE experts split over the DP x TP ranks of a stage instead of replicated; the DP "
                                   "replicas then form one world and step together")
    enable_eplb: bool = Field(default=False, description="rebalance experts over the EP ranks by their measured load")
    custom_all_reduce: bool = Field(
        default=False,
        description="TP all-reduces through raygrid's one-shot/two-shot kernels over peer-visible buffers where the "
                    "GPUs are NVLink peers on one host (NCCL otherwise, and above 8 MiB); off until measured on GPUs")
    eplb_config: EPLBConfig = EPLBConfig()
    # "ray": workers are Ray actors (needed for more than one device); "inprocess": one device here.
    distributed_executor_backend: Literal["inprocess", "ray"] | None = None
    ray_address: str | None = Field(default=None, description="Ray cluster to join ('auto'); default: start a local one")
    ray_worker_cpus: float = Field(default=1.0, gt=0.0, description="CPUs a worker actor reserves")
    compiled_graph: bool | None = Field(
        default=None,
        description="on Ray: send each step to the workers through a Ray Compiled Graph (default: when the workers have GPUs)",
    )
    step_timeout_s: float = Field(
        default=300.0, gt=0.0,
        description="a step that makes no progress for this long fails its requests: on Ray its replica, and an engine "
                    "process (raygrid serve) that says nothing for this long with requests in flight (loading is exempt); "
                    "an engine in the server's process whose step has not returned after twice this is dead",
    )
    max_migrations: int = Field(
        default=3, ge=0,
        description="on Ray: how many times a request may move to another replica after its own failed (0: it fails)",
    )
    migration_timeout_s: float = Field(
        default=300.0, gt=0.0,
        description="on Ray: how long a request may wait for a healthy replica (a rebuild) before it fails",
    )

    @model_validator(mode="after")
    def _pick_backend(self) -> "ParallelConfig":
        if self.distributed_executor_backend is None:
            several = self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size > 1
            object.__setattr__(self, "distributed_executor_backend", "ray" if several else "inprocess")
        elif self.distributed_executor_backend == "inprocess" and self.world_size > 1:
            raise ValueError(
                f"distributed_executor_backend 'inprocess' runs one device; tensor_parallel_size x "
                f"pipeline_parallel_size x data_parallel_size = {self.world_size} needs 'ray'"
            )
        return self

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @model_validator(mode="after")
    def _check_eplb(self) -> "ParallelConfig":
        if self.enable_eplb and not self.enable_expert_parallel:
            raise ValueError("enable_eplb needs enable_expert_parallel: experts are only rebalanced between EP ranks")
        defaults, given = EPLBConfig(), self.eplb_config
        changed = [name for name in EPLBConfig.model_fields if getattr(given, name) != getattr(defaults, name)]
        if changed and not self.enable_expert_parallel:
            raise ValueError(f"eplb_config.{changed[0]}: needs enable_expert_parallel")
        balancer_only = [name for name in changed if name != "num_redundant_experts"]
        if balancer_only and not self.enable_eplb:
            raise ValueError(f"eplb_config.{balancer_only[0]}: needs enable_eplb (only the balancer reads it)")
        return self

    @property
    def num_engine_replicas(self) -> int:
        """Engine replicas the front end balances over: the DP replicas, or one under expert parallelism, where
        the DP replicas share the experts and so are one world that steps together (and fails together)."""
        return 1 if self.enable_expert_parallel else self.data_parallel_size

    def replica_grid(self) -> RankGrid:
        """The rank grid of one engine replica: its PP x TP workers, times DP under expert parallelism."""
        dp = self.data_parallel_size if self.enable_expert_parallel else 1
        return RankGrid(tp=self.tensor_parallel_size, pp=self.pipeline_parallel_size, dp=dp)


class EngineConfig(_Strict):
    model: ModelConfig
    cache: CacheConfig = CacheConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    parallel: ParallelConfig = ParallelConfig()
    device: Device = "auto"

    @model_validator(mode="after")
    def _check_budget(self) -> "EngineConfig":
        sched, max_len = self.scheduler, self.model.max_model_len
        if sched.max_num_batched_tokens is None or max_len is None:
            return self  # resolved later, once the checkpoint's context length is known
        if not sched.enable_chunked_prefill and sched.max_num_batched_tokens < max_len:
            raise ValueError(
                f"max_num_batched_tokens ({sched.max_num_batched_tokens}) must be >= max_model_len "
                f"({max_len}) when enable_chunked_prefill is False: a whole prompt must fit in one step"
            )
        return self

    def resolve(self, checkpoint_max_len: int) -> "EngineConfig":
        """Fill in the defaults that depend on the checkpoint, checking the limits again."""
        max_len = self.model.max_model_len or checkpoint_max_len
        if max_len > checkpoint_max_len:
            raise ValueError(
                f"max_model_len ({max_len}) is larger than the checkpoint's max_position_embeddings "
                f"({checkpoint_max_len})"
            )
        budget = self.scheduler.max_num_batched_tokens
        if budget is None:
            budget = DEFAULT_BUDGET if self.scheduler.enable_chunked_prefill else max(DEFAULT_BUDGET, max_len)
        async_scheduling = self.scheduler.async_scheduling
        staged = self.parallel.pipeline_parallel_size > 1
        on_gpu = self.on_gpu()
        if async_scheduling is None:
            async_scheduling = on_gpu and not staged
        elif async_scheduling and staged:
            raise ValueError(
                f"async_scheduling needs pipeline_parallel_size 1 (got {self.parallel.pipeline_parallel_size}): "
                "pipeline stages already keep one batch in flight each"
            )
        block_size = self.cache.block_size or (GPU_BLOCK_SIZE if on_gpu else CPU_BLOCK_SIZE)
        return EngineConfig(
            model=self.model.model_copy(update={"max_model_len": max_len}),
            cache=self.cache.model_copy(update={"block_size": block_size}),
            scheduler=self.scheduler.model_copy(update={"max_num_batched_tokens": budget, "async_scheduling": async_scheduling}),
            parallel=self.parallel,
            device=self.device,
        )

    def on_gpu(self) -> bool:
        """Whether the engine runs on GPUs. "auto" is this process's device: on Ray, create_engine_config has
        already made it the workers' ("cuda" or "cpu")."""
        if self.device != "auto":
            return self.device == "cuda"
        import torch

        return torch.cuda.is_available()
