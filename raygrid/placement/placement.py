"""Where a replica's workers run: Ray placement groups with one bundle per worker.

Each pipeline stage gets a STRICT_PACK placement group of its TP workers, so a tensor-parallel group
always shares one node (its all-reduces stay on NVLink); stages are placed independently, so they
spread over nodes when one node cannot hold them all. Before asking, the cluster's resources are
checked, so an impossible grid fails at once with what was asked and what exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raygrid.parallel.rank_grid import RankGrid


@dataclass
class WorkerSlot:
    rank: int
    placement_group: PlacementGroup
    bundle_index: int


def ensure_ray(address: str | None) -> None:
    if not ray.is_initialized():
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)


def uses_gpu(device: str) -> bool:
    """Workers take a GPU each unless the engine runs on CPU (or the cluster has no GPU and none was asked)."""
    return device != "cpu" and (device == "cuda" or ray.cluster_resources().get("GPU", 0) > 0)


def workers_device(device: str, address: str | None) -> str:
    """Where a Ray replica's workers run, "cuda" or "cpu": decided once, by the cluster's resources rather than by
    the process asking, so that a CPU-only head configures its engine for GPU workers. A cluster yet to be
    started here (no address, none joined) will have this machine's devices, and is not started for the question."""
    if device != "auto":
        return device
    if not ray.is_initialized() and address is None and not os.environ.get("RAY_ADDRESS"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    ensure_ray(address)
    return "cuda" if uses_gpu(device) else "cpu"


def worker_bundle(use_gpu: bool, worker_cpus: float) -> dict[str, float]:
    return {"GPU": 1.0, "CPU": worker_cpus} if use_gpu else {"CPU": worker_cpus}


def check_cluster_fits(grid: RankGrid, use_gpu: bool, worker_cpus: float, num_replicas: int = 1) -> None:
    """Raise a ValueError naming the shortfall if the alive nodes cannot hold the replicas' workers."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    kind = "GPU" if use_gpu else "CPU"
    per_worker = 1.0 if use_gpu else worker_cpus
    per_node = sorted((n["Resources"].get(kind, 0.0) for n in nodes), reverse=True)
    total = sum(per_node)
    need_total = grid.world_size * num_replicas * per_worker
    need_node = grid.tp * per_worker
    summary = f"the cluster has {len(nodes)} node(s) with {total:g} {kind} in all, {per_node[0] if per_node else 0:g} on the largest"
    if need_total > total:
        raise ValueError(
            f"{num_replicas} replica(s) of tensor_parallel_size={grid.tp} x pipeline_parallel_size={grid.pp}"
            f"{f' x data_parallel_size={grid.dp} (expert parallelism: one world)' if grid.dp > 1 else ''} need "
            f"{need_total:g} {kind}; {summary}"
        )
    if not per_node or need_node > per_node[0]:
        raise ValueError(f"tensor_parallel_size={grid.tp} needs {need_node:g} {kind} on one node; {summary}")


def reserve_replica(grid: RankGrid, use_gpu: bool, worker_cpus: float) -> list[WorkerSlot]:
    """Ask for one placement group per pipeline stage, without waiting for them: each rank's slot, in rank
    order. Actors scheduled into a slot start once Ray has placed its group."""
    bundle = worker_bundle(use_gpu, worker_cpus)
    slots: list[WorkerSlot] = []
    for stage_ranks in _stage_ranks(grid):
        pg = placement_group([dict(bundle) for _ in stage_ranks], strategy="STRICT_PACK")
        slots.extend(WorkerSlot(rank, pg, i) for i, rank in enumerate(stage_ranks))
    return sorted(slots, key=lambda s: s.rank)


def place_replica(grid: RankGrid, use_gpu: bool, worker_cpus: float, timeout_s: float = 120.0) -> list[WorkerSlot]:
    """``reserve_replica``, waiting until every group is placed (a TimeoutError naming what was asked and
    what is free, when they are not within ``timeout_s``)."""
    slots = reserve_replica(grid, use_gpu, worker_cpus)
    groups = list({id(s.placement_group): s.placement_group for s in slots}.values())
    ready, _ = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=timeout_s)
    if len(ready) < len(groups):
        release(slots)
        raise TimeoutError(
            f"placement groups for tensor_parallel_size={grid.tp} x pipeline_parallel_size={grid.pp} "
            f"({worker_bundle(use_gpu, worker_cpus)} per worker) were not placed within {timeout_s:g} s; "
            f"available: {ray.available_resources()}"
        )
    return slots


def _stage_ranks(grid: RankGrid) -> list[list[int]]:
    """The ranks of each pipeline stage of one replica (each stage is one TP group)."""
    return grid.tp_groups()


def release(slots: list[WorkerSlot]) -> None:
    for pg in {id(s.placement_group): s.placement_group for s in slots}.values():
        try:
            remove_placement_group(pg)
        except Exception:  # already gone with the cluster
            pass


# ---------------------------------------------------------------------- a Serve replica's own placement group


def replica_bundles(grid: RankGrid, use_gpu: bool, worker_cpus: float) -> tuple[list[dict[str, float]], str]:
    """The bundles and strategy of a Serve replica's placement group: bundle 0 for the replica actor (with the
    device, when the engine has one rank and runs in the replica's own engine process), then one per worker.
    One stage packs strictly onto a node; several may spread (PACK), and ``slots_in`` checks that no TP group
    was split."""
    if grid.world_size == 1:
        return [worker_bundle(use_gpu, worker_cpus)], "STRICT_PACK"
    return [{"CPU": 1.0}] + [worker_bundle(use_gpu, worker_cpus) for _ in range(grid.world_size)], \
        "STRICT_PACK" if grid.pp == 1 else "PACK"


def slots_in(pg: PlacementGroup, grid: RankGrid) -> list[WorkerSlot]:
    """Worker slots in a placement group made by ``replica_bundles`` (rank r in bundle r + 1); a TP group whose
    bundles landed on different nodes is refused, naming the nodes."""
    from ray.util.placement_group import placement_group_table

    nodes = placement_group_table(pg).get("bundles_to_node_id", {})
    for group in grid.tp_groups():
        where = {nodes.get(rank + 1) for rank in group}
        if len(where) > 1:
            raise ValueError(f"tensor_parallel_size={grid.tp}: ranks {group} were placed on {len(where)} nodes "
                             f"({', '.join(sorted(map(str, where)))}); a TP group needs one node with {grid.tp} devices")
    return [WorkerSlot(rank, pg, rank + 1) for rank in range(grid.world_size)]


@ray.remote(num_cpus=0)
def _read_checkpoint(path: str) -> tuple[str, str | None]:
    import os

    node = ray.util.get_node_ip_address()
    try:
        with open(os.path.join(path, "config.json"), "rb") as f:
            f.read(1)
    except OSError as error:
        return node, f"{type(error).__name__}: {error.strerror or error}"
    return node, None


def check_checkpoint_readable(path: str, slots: list[WorkerSlot]) -> None:
    """Every worker's node must read the checkpoint (a shared path, or a copy at the same path on each node);
    raise a ValueError naming the first node that cannot, and the path."""
    refs = [_read_checkpoint.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        s.placement_group, placement_group_bundle_index=s.bundle_index)).remote(path) for s in slots]
    for slot, (node, error) in zip(slots, ray.get(refs)):
        if error is not None:
            raise ValueError(f"node {node} (rank {slot.rank}) cannot read the checkpoint at {path}: {error}; "
                             "put it on a path every node shares, or copy it to that path on each node")
