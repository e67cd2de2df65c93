"""Process groups of one engine replica, built from its rank grid.

Every group has a device group (NCCL on GPU, gloo on CPU) for tensors and a CPU gloo group for
Python objects and barriers. All ranks create every group in the same order (torch.distributed
requires it) and keep the ones they belong to. A group of one rank does no communication at all, so
a single-device engine needs no torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from raygrid.parallel.rank_grid import RankGrid


class GroupCoordinator:
    def __init__(self, ranks: list[int], rank: int, device_group=None, cpu_group=None) -> None:
        self.ranks = ranks
        self.rank = rank
        self.rank_in_group = ranks.index(rank)
        self.world_size = len(ranks)
        self.device_group = device_group
        self.cpu_group = cpu_group
        self.custom = None  # the TP group's CustomAllReduce, when init_parallel_state is asked for one

    @property
    def is_first(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The group's sum of ``tensor``: in place through NCCL/gloo, or in a new tensor through the custom kernels."""
        if self.world_size == 1:
            return tensor
        if self.custom is not None and self.custom.can_reduce(tensor):
            return self.custom.all_reduce(tensor)
        dist.all_reduce(tensor, group=self.device_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim`` (same shape on all ranks), in group order. Along dim 0
        on a GPU it lands in one buffer (gloo has no all_gather_into_tensor)."""
        if self.world_size == 1:
            return tensor
        if tensor.is_cuda and dim == 0:
            out = torch.empty((self.world_size * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
            dist.all_gather_into_tensor(out, tensor.contiguous(), group=self.device_group)
            return out
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the group and keep this rank's slice of dim 0 (``world_size`` equal slices)."""
        if self.world_size == 1:
            return tensor
        rows = tensor.shape[0] // self.world_size
        if tensor.is_cuda:
            out = torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
            dist.reduce_scatter_tensor(out, tensor.contiguous(), group=self.device_group)
            return out
        total = tensor.contiguous()  # gloo has no reduce_scatter: the whole sum, then this rank's slice
        dist.all_reduce(total, group=self.device_group)
        return total[self.rank_in_group * rows : (self.rank_in_group + 1) * rows]

    def all_gather_ints(self, values: list[int]) -> list[list[int]]:
        """Every rank's ``values`` (the same length on all; on the CPU group: no device synchronisation)."""
        if self.world_size == 1:
            return [list(values)]
        mine = torch.tensor(values, dtype=torch.int64)
        parts = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.cpu_group)
        return [p.tolist() for p in parts]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def send(self, tensors: list[torch.Tensor], dst: int) -> None:
        """Send tensors to the group's rank ``dst``; the receiver knows their shapes."""
        for tensor in tensors:
            dist.send(tensor.contiguous(), dst=self.ranks[dst], group=self.device_group)

    def recv(self, shapes: list[tuple[int, ...]], dtype: torch.dtype, device: torch.device, src: int) -> list[torch.Tensor]:
        out = []
        for shape in shapes:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(tensor, src=self.ranks[src], group=self.device_group)
            out.append(tensor)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.cpu_group)


@dataclass
class ParallelState:
    grid: RankGrid
    rank: int
    tp: GroupCoordinator
    pp: GroupCoordinator
    # The replica's DP ranks of this stage and TP position (one rank unless the DP replicas are one world),
    # and under expert parallelism the stage's EP group (DP x TP) and a second communicator over the same
    # ranks for the load balancer, so that its traffic never interleaves with the forward pass's.
    dp: GroupCoordinator
    ep: GroupCoordinator | None = None
    eplb: GroupCoordinator | None = None
    # Expert slots beyond one per expert on the EP group, and the EPLB load window (0: no load recorded).
    num_redundant_experts: int = 0
    eplb_window_size: int = 0


_STATE: ParallelState | None = None


def init_parallel_state(grid: RankGrid, rank: int, init_method: str | None, device: torch.device, timeout_s: float = 600.0,
                        expert_parallel: bool = False, custom_all_reduce: bool = False) -> ParallelState:
    """Join the replica's world (if it has more than one rank) and build its groups; with ``custom_all_reduce``
    the TP group sums through parallel.custom_all_reduce where its ranks allow it."""
    global _STATE
    if grid.world_size > 1:
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=grid.world_size,
                                    timeout=timedelta(seconds=timeout_s))
        tp = _make_group(grid.tp_groups(), rank, device)
        pp = _make_group(grid.pp_groups(), rank, device)
        dp = _make_group(grid.dp_groups(), rank, device)
        ep = _make_group(grid.ep_groups(), rank, device) if expert_parallel else None
        eplb = _make_group(grid.ep_groups(), rank, device) if expert_parallel else None
    else:
        tp, pp, dp = GroupCoordinator([0], 0), GroupCoordinator([0], 0), GroupCoordinator([0], 0)
        ep = eplb = GroupCoordinator([0], 0) if expert_parallel else None
    _STATE = ParallelState(grid, rank, tp, pp, dp, ep, eplb)
    if custom_all_reduce and tp.world_size > 1:
        from raygrid.parallel.custom_all_reduce import CustomAllReduce

        tp.custom = CustomAllReduce(tp, device)
    return _STATE


def _make_group(all_groups: list[list[int]], rank: int, device: torch.device) -> GroupCoordinator:
    mine = None
    for ranks in all_groups:  # every rank creates every group, in the same order
        device_group = dist.new_group(ranks, backend="nccl" if device.type == "cuda" else "gloo")
        cpu_group = dist.new_group(ranks, backend="gloo")
        if rank in ranks:
            mine = GroupCoordinator(ranks, rank, device_group, cpu_group)
    assert mine is not None
    return mine


def get_parallel_state() -> ParallelState:
    if _STATE is None:  # a single-device engine never called init_parallel_state
        return init_parallel_state(RankGrid(), 0, None, torch.device("cpu"))
    return _STATE


def get_tp_group() -> GroupCoordinator:
    return get_parallel_state().tp


def get_pp_group() -> GroupCoordinator:
    return get_parallel_state().pp


def get_dp_group() -> GroupCoordinator:
    return get_parallel_state().dp


def get_ep_group() -> GroupCoordinator | None:
    """The stage's expert-parallel group; None when experts are replicated on every rank."""
    return get_parallel_state().ep


def destroy_parallel_state() -> None:
    global _STATE
    if _STATE is not None and _STATE.tp.custom is not None:
        _STATE.tp.custom.close()
    _STATE = None
    if dist.is_initialized():
        dist.destroy_process_group()
