"""Worker: one device, its model, its KV cache and its model runner."""

from __future__ import annotations

import logging

import torch

from raygrid.config import EngineConfig
from raygrid.engine.model_runner import ModelRunner
from raygrid.engine.outputs import SchedulerOutput
from raygrid.models.loader import load_hf_config, load_model, resolve_dtype
from raygrid.parallel.groups import init_parallel_state

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but torch sees no CUDA device")
    return torch.device(device)


class Worker:
    """``rank`` and ``init_method`` place the worker in its replica's world (RankGrid of the parallel
    config); a single-device engine leaves them at their defaults."""

    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], rank: int = 0, init_method: str | None = None,
                 device: torch.device | None = None) -> None:
        self.config = config
        self.rank = rank
        self.device = device or resolve_device(config.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device.index or 0)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.parallel = init_parallel_state(config.parallel.replica_grid(), rank, init_method, self.device)
        self.hf_config = load_hf_config(config.model.model)
        self.dtype = resolve_dtype(config.model.dtype, self.hf_config, self.device)
        torch.manual_seed(config.model.seed)
        self.model = load_model(config.model.model, self.hf_config, self.dtype, self.device)
        self.runner = ModelRunner(config, self.model, self.device, self.dtype, eos_token_ids)

    def determine_num_kv_blocks(self) -> int:
        """How many KV blocks fit: on GPU what is left of ``gpu_memory_utilization`` after a profiling
        forward pass at the largest batch; on CPU ``cpu_kv_cache_space_gib``."""
        cache = self.config.cache
        per_block = self.runner.kv_cache_bytes_per_block()
        if self.device.type != "cuda":
            return max(int(cache.cpu_kv_cache_space_gib * 2**30 // per_block), 2)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.runner.profile_forward(self.config.scheduler.max_num_batched_tokens)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        used_outside_torch = (total - free) - torch.cuda.memory_reserved()
        budget = total * cache.gpu_memory_utilization - peak - used_outside_torch
        torch.cuda.empty_cache()
        logger.info("KV cache budget %.2f GiB (peak activations+weights %.2f GiB)", budget / 2**30, peak / 2**30)
        return max(int(budget // per_block), 0)

    def initialize_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(self.runner.allocate_kv_cache(num_blocks))

    def execute_model(self, scheduler_output: SchedulerOutput, non_blocking: bool = False):
        return self.runner.execute_model(scheduler_output, non_blocking)
