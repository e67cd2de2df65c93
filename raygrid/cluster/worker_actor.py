"""WorkerActor: a Ray actor hosting one engine Worker (one GPU, or a CPU slot).

A GPU worker sees every GPU of its node (the executor starts it with Ray's
RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES) and uses the one Ray assigned to it. Were it to see its own
GPU only, NCCL could not open its peers' memory, and the all-reduces of a tensor-parallel group would go
through host memory instead of NVLink.

torch is imported by the methods, which run in the worker's process, and not by the module: the driver imports this
module to start its workers and needs no torch itself (about 2 s of a Ray engine's start on two cores).
"""

from __future__ import annotations

import os
import socket

import ray

from raygrid.config import EngineConfig
from raygrid.engine.outputs import ModelRunnerOutput, SchedulerOutput


@ray.remote
class WorkerActor:
    def __init__(self, config: EngineConfig, eos_token_ids: frozenset[int], rank: int) -> None:
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.rank = rank
        self.worker = None
        self.device_index: int | None = None
        import torch

        if config.device == "cpu" or not torch.cuda.is_available():
            # Many workers may share a few cores: one thread each avoids oversubscription.
            torch.set_num_threads(1)

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: rank 0's becomes the replica's rendezvous point."""
        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, s.getsockname()[1]

    def init_worker(self, init_method: str) -> None:
        """Join the replica's world and load this rank's shard of the model (all ranks at once)."""
        import torch

        from raygrid.engine.worker import Worker

        device = None
        if self.config.device != "cpu" and torch.cuda.is_available():
            device = torch.device("cuda", assigned_gpu_index())
            if "CUDA_VISIBLE_DEVICES" not in os.environ:
                # Ray's compiled graph maps this actor's GPU id through the variable: name every device seen.
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(torch.cuda.device_count()))
            from ray.experimental.channel import ChannelContext

            ChannelContext.get_current().set_torch_device(device)
        self.device_index = device.index if device is not None else None
        self.worker = Worker(self.config, self.eos_token_ids, rank=self.rank, init_method=init_method, device=device)

    def execute_method(self, method: str, *args, **kwargs):
        return getattr(self.worker, method)(*args, **kwargs)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._on_device()
        return self.worker.execute_model(scheduler_output)

    def execute_model_pipelined(self, scheduler_output: SchedulerOutput | None) -> ModelRunnerOutput | None:
        self._on_device()
        return self.worker.execute_model_pipelined(scheduler_output)

    def _on_device(self) -> None:
        import torch

        # A compiled graph calls the step methods on a thread of its own, whose current device starts at cuda:0.
        if self.device_index is not None and torch.cuda.current_device() != self.device_index:
            torch.cuda.set_device(self.device_index)

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


def assigned_gpu_index() -> int:
    """The index, among the devices this process sees, of the GPU Ray assigned to this actor. Ray's ids
    are the node's device ids, which are positions in the node's CUDA_VISIBLE_DEVICES when it has one."""
    assigned = ray.get_runtime_context().get_accelerator_ids()["GPU"]
    if not assigned:
        raise RuntimeError("this worker was given no GPU by Ray")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and ",".join(assigned) == visible:
        return 0  # Ray did set the variable (it ignored the request not to): the one visible device is ours
    return visible.split(",").index(assigned[0]) if visible else int(assigned[0])
