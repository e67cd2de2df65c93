"""Worker: one device, its model, its KV cache and its model runner."""

from __future__ import annotations

import dataclasses
import logging

import torch

from raygrid.config import EngineConfig
from raygrid.engine import memory_profile
from raygrid.engine.model_runner import ModelRunner
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput
from raygrid.models.loader import load_hf_config, load_model, resolve_dtype
from raygrid.parallel.eplb import expert_layers
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
        self.parallel = init_parallel_state(config.parallel.replica_grid(), rank, init_method, self.device,
                                            expert_parallel=config.parallel.enable_expert_parallel,
                                            custom_all_reduce=config.parallel.custom_all_reduce)
        if config.parallel.enable_expert_parallel:  # read by the MoE layers as the model is built
            eplb = config.parallel.eplb_config
            self.parallel.num_redundant_experts = eplb.num_redundant_experts
            self.parallel.eplb_window_size = eplb.window_size if config.parallel.enable_eplb else 0
        self.hf_config = load_hf_config(config.model.model)
        self.dtype = resolve_dtype(config.model.dtype, self.hf_config, self.device)
        torch.manual_seed(config.model.seed)
        self.model = load_model(config.model.model, self.hf_config, self.dtype, self.device, config.model.load_format,
                                config.model.seed, config.model.quantization)
        self.runner = ModelRunner(config, self.model, self.device, self.dtype, eos_token_ids)
        self.dp_rank = self.parallel.grid.coords(rank).dp  # which entry of a world step is this rank's
        self._memory: dict[str, int] = {}
        self._launched = None  # execute_model_pipelined's step in flight
        self._num_steps, self._execute_seconds = 0, 0.0  # the steps this rank answered (step_report)

    def determine_num_kv_blocks(self) -> int:
        """How many KV blocks fit: on GPU what is left of ``gpu_memory_utilization`` after the peak of the
        worst step (a forward pass at the largest token budget, then sampling at the largest batch) and
        after the decode CUDA graphs' memory; on CPU ``cpu_kv_cache_space_gib``."""
        cache = self.config.cache
        per_block = self.runner.kv_cache_bytes_per_block()
        if self.device.type != "cuda":
            return max(int(cache.cpu_kv_cache_space_gib * 2**30 // per_block), 2)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        memory_profile.profile_forward(self.runner, self.config.scheduler.max_num_batched_tokens)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        free, total = torch.cuda.mem_get_info()
        used_outside_torch = (total - free) - torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        graphs = memory_profile.profile_cuda_graphs(self.runner)
        budget = total * cache.gpu_memory_utilization - peak - used_outside_torch - graphs
        logger.info("KV cache budget %.2f GiB (peak of weights, activations and sampling %.2f GiB; CUDA graphs %.3f GiB)",
                    budget / 2**30, peak / 2**30, graphs / 2**30)
        self._memory = {"gpu_total_bytes": total, "peak_step_bytes": peak, "profiled_cuda_graph_bytes": graphs}
        return max(int(budget // per_block), 0)

    def initialize_cache(self, num_blocks: int) -> None:
        per_block = self.runner.kv_cache_bytes_per_block()
        if self.device.type != "cuda":
            memory_profile.check_host_pool(num_blocks, per_block, self.config.cache.num_kv_blocks is not None)
        self.runner.initialize_kv_cache(self.runner.allocate_kv_cache(num_blocks))
        self._memory.update(num_kv_blocks=num_blocks, kv_cache_bytes=num_blocks * per_block,
                            cuda_graph_bytes=self.runner.graph_memory_bytes)

    def memory_report(self) -> dict[str, int]:
        """What the KV sizing assumed and what the KV pool and CUDA graphs then took, in bytes."""
        return dict(self._memory)

    def device_report(self) -> dict:
        """Which device this worker drives, how many it sees, which of those it can reach as peers (NVLink or
        PCIe peer access, what NCCL's fast paths need), and whether its TP group sums through the custom
        all-reduce (or why not)."""
        custom = self.parallel.tp.custom
        report = {"device": str(self.device),
                  "custom_all_reduce": None if custom is None else {"enabled": custom.enabled, "reason": custom.reason}}
        if self.device.type == "cuda":
            index, count = self.device.index, torch.cuda.device_count()
            report.update(name=torch.cuda.get_device_name(self.device), visible_devices=count,
                          peer_access=[i for i in range(count) if i != index and torch.cuda.can_device_access_peer(index, i)])
        return report

    def reset_requests(self) -> None:
        """Forget every request (after a failed step the scheduler sends the survivors in full again)."""
        self.runner.reset_requests()
        self._launched = None

    def _own(self, step):
        """This rank's SchedulerOutput of a step: under expert parallelism a step carries one per DP rank
        (None for a rank with nothing to run, which still takes part in the forward pass)."""
        return step[self.dp_rank] if isinstance(step, list) else step

    def execute_model(self, scheduler_output, non_blocking: bool = False, defer_grammar: bool = False):
        result = self.runner.execute_model(self._own(scheduler_output), non_blocking, defer_grammar)
        return result if non_blocking else self._counted(result)

    def _counted(self, output: ModelRunnerOutput | None) -> ModelRunnerOutput | None:
        if output is not None:
            self._num_steps += 1
            self._execute_seconds += output.execute_seconds
        return output

    def expert_placement(self) -> list[list[tuple[int, torch.Tensor, torch.Tensor]]]:
        """Under expert parallelism, per MoE layer of this rank: each slot's logical expert and its weights
        (w13, w2), on the CPU."""
        return [[(expert, layer.w13[slot].cpu(), layer.w2[slot].cpu()) for slot, expert in enumerate(layer.map.local_experts())]
                for layer in expert_layers(self.model)]

    def eplb_reports(self) -> list[dict]:
        """This rank's EPLB rebalances so far (balancedness before and after, seconds, experts moved)."""
        rebalancer = self.runner.rebalancer
        return [dataclasses.asdict(r) for r in rebalancer.reports] if rebalancer is not None else []

    def step_report(self) -> dict:
        """This rank's steps since start and their mean time from taking a step to its tokens on the host."""
        return {"rank": self.rank, "num_steps": self._num_steps,
                "mean_execute_s": self._execute_seconds / self._num_steps if self._num_steps else 0.0}

    def execute_model_pipelined(self, scheduler_output: SchedulerOutput | None) -> ModelRunnerOutput | None:
        """Launch this step, then return the output of the step launched before it (None if none was): the
        host prepares a step while the device still runs the one before, as async scheduling does in one
        process. ``None`` launches nothing and returns the step in flight. For a worker that gets its steps
        one call at a time (a Ray actor), with async scheduling."""
        launched = self.runner.execute_model(self._own(scheduler_output), non_blocking=True) if scheduler_output is not None else None
        previous, self._launched = self._launched, launched
        return self._counted(previous.result()) if previous is not None else None
