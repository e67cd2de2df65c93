"""EPLB: the expert-parallel load balancer.

Each MoE layer under expert parallelism has ``num_physical = num_experts + num_redundant_experts`` expert
slots, ``num_physical / ep_size`` on each EP rank. Which logical expert each slot holds is the layer's
``ExpertMap``: device tensors (so CUDA graphs and kernels read them without the host), changed in place.

With EPLB on, each layer counts the real tokens its own slots take per step into a sliding window
(``window_size`` steps). Every ``step_interval`` steps all ranks of the stage together (``Rebalancer``):
1. sum the windows of every slot over the EP ranks (an all-reduce on the EPLB group, a communicator of
   its own, so its traffic never interleaves with a forward pass's);
2. compute new maps with DeepSeek's algorithm (``rebalance_experts``): hot experts take the redundant
   slots, then the replicas are packed onto ranks so each carries about the same load; hierarchical
   (expert groups to nodes first) when the groups divide over the nodes, global otherwise;
3. move the expert weights each rank now needs and lacks, point to point, on the EPLB group;
4. commit the new maps.
A new map that would not balance the window better than the current one is not applied.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from raygrid.parallel.groups import GroupCoordinator, get_parallel_state

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- the maps


def initial_map(num_experts: int, num_physical: int) -> np.ndarray:
    """Slot p holds logical expert p % num_experts: every expert once, the redundant slots repeat the first ones."""
    return np.arange(num_physical) % num_experts


class ExpertMap(nn.Module):
    """One MoE layer's placement: ``physical_to_logical`` ``[P]``, ``logical_to_physical`` ``[E, R]`` (each
    expert's slots, -1 past its ``logical_replica_count``) with R = num_redundant + 1, all on the device; and
    the load window ``[window_size, slots]`` of this rank's slots when ``window_size`` > 0."""

    def __init__(self, num_experts: int, num_physical: int, ep: GroupCoordinator, window_size: int) -> None:
        super().__init__()
        self.num_experts, self.num_physical = num_experts, num_physical
        self.slots = num_physical // ep.world_size
        self.first_slot = ep.rank_in_group * self.slots
        self.max_replicas = num_physical - num_experts + 1
        self.register_buffer("physical_to_logical", torch.zeros(num_physical, dtype=torch.int64), persistent=False)
        self.register_buffer("logical_to_physical", torch.zeros(num_experts, self.max_replicas, dtype=torch.int64), persistent=False)
        self.register_buffer("logical_replica_count", torch.zeros(num_experts, dtype=torch.int64), persistent=False)
        self.register_buffer("window", torch.zeros(window_size, self.slots, dtype=torch.int64), persistent=False)
        self.window_row = 0  # which row this step's load goes to (the Rebalancer moves it)
        self.host_map = initial_map(num_experts, num_physical)
        self.commit(self.host_map)

    def commit(self, physical_to_logical: np.ndarray) -> None:
        """Make ``physical_to_logical`` the layer's map (in place: graphs keep pointing at the same tensors)."""
        self.host_map = np.asarray(physical_to_logical, dtype=np.int64).copy()
        to_physical, counts = replica_tables(self.host_map, self.num_experts, self.max_replicas)
        self.physical_to_logical.copy_(torch.from_numpy(self.host_map))
        self.logical_to_physical.copy_(torch.from_numpy(to_physical))
        self.logical_replica_count.copy_(torch.from_numpy(counts))

    def local_experts(self) -> list[int]:
        """The logical expert of each of this rank's slots."""
        return self.host_map[self.first_slot : self.first_slot + self.slots].tolist()

    def to_local(self, topk_ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Logical expert ids ``[T, k]`` -> this rank's slot for each pair, ``slots`` where another rank's slot
        serves it. A pair's replica is chosen by its token's row, so an expert's tokens spread over its replicas.
        Records the real tokens (``valid`` rows) each local slot takes into the window."""
        row = torch.arange(topk_ids.shape[0], device=topk_ids.device)[:, None]
        replica = row % self.logical_replica_count[topk_ids]
        physical = self.logical_to_physical[topk_ids, replica]
        local = physical - self.first_slot
        local = torch.where((local >= 0) & (local < self.slots), local, self.slots)
        if self.window.shape[0]:
            counts = torch.zeros(self.slots + 1, dtype=torch.int64, device=topk_ids.device)
            counts.scatter_add_(0, local.flatten(), valid[:, None].expand_as(local).flatten().to(torch.int64))
            self.window[self.window_row] = counts[: self.slots]
        return local


def expert_layers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE layers whose experts an ExpertMap places (FusedExperts under expert parallelism)."""
    return [m for m in model.modules() if getattr(m, "map", None) is not None and hasattr(m, "w13")]


def replica_tables(physical_to_logical: np.ndarray, num_experts: int, max_replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """``logical_to_physical`` ``[E, max_replicas]`` (-1 padded) and ``logical_replica_count`` ``[E]``."""
    to_physical = np.full((num_experts, max_replicas), -1, dtype=np.int64)
    counts = np.zeros(num_experts, dtype=np.int64)
    for slot, expert in enumerate(physical_to_logical.tolist()):
        to_physical[expert, counts[expert]] = slot
        counts[expert] += 1
    if (counts == 0).any():
        raise ValueError(f"experts {np.nonzero(counts == 0)[0].tolist()} have no slot")
    return to_physical, counts


# ---------------------------------------------------------------------------------------------- the algorithm


def balanced_packing(weight: np.ndarray, num_packs: int) -> np.ndarray:
    """Items ``[n]`` into ``num_packs`` packs of ``n / num_packs`` items each: heaviest first, each into the
    lightest pack with room (the lowest-numbered among equals). Returns each item's pack."""
    n = weight.shape[0]
    per_pack = n // num_packs
    pack_of = np.zeros(n, dtype=np.int64)
    load = np.zeros(num_packs)
    count = np.zeros(num_packs, dtype=np.int64)
    for item in np.argsort(-weight, kind="stable"):
        open_packs = np.nonzero(count < per_pack)[0]
        pack = open_packs[np.argmin(load[open_packs])]
        pack_of[item] = pack
        load[pack] += weight[item]
        count[pack] += 1
    return pack_of


def replicate_experts(weight: np.ndarray, num_slots: int) -> np.ndarray:
    """Every expert once, then each extra slot to the expert with the most load per replica. Returns each
    slot's expert ``[num_slots]`` (slot i < len(weight) holds expert i)."""
    num_experts = weight.shape[0]
    slot_expert = np.concatenate([np.arange(num_experts), np.zeros(num_slots - num_experts, dtype=np.int64)])
    replicas = np.ones(num_experts, dtype=np.int64)
    for slot in range(num_experts, num_slots):
        hot = int(np.argmax(weight / replicas))
        slot_expert[slot] = hot
        replicas[hot] += 1
    return slot_expert


def _place(weight: np.ndarray, num_slots: int, num_ranks: int) -> np.ndarray:
    """Replicate, then pack the slots onto ranks by load per replica: the slot-ordered map ``[num_slots]``."""
    slot_expert = replicate_experts(weight, num_slots)
    replicas = np.bincount(slot_expert, minlength=weight.shape[0])
    per_slot = weight[slot_expert] / replicas[slot_expert]
    rank_of = balanced_packing(per_slot, num_ranks)
    per_rank = num_slots // num_ranks
    out = np.zeros(num_slots, dtype=np.int64)
    filled = np.zeros(num_ranks, dtype=np.int64)
    for slot in np.argsort(-per_slot, kind="stable"):  # each rank's slots in the order they were packed
        rank = rank_of[slot]
        out[rank * per_rank + filled[rank]] = slot_expert[slot]
        filled[rank] += 1
    return out


def rebalance_experts(load: np.ndarray, num_physical: int, num_ranks: int, num_groups: int = 1, num_nodes: int = 1) -> np.ndarray:
    """DeepSeek's EPLB for one layer: the new ``physical_to_logical`` ``[num_physical]`` for the logical
    experts' ``load`` ``[E]``. Hierarchical when the ``num_groups`` expert groups divide over ``num_nodes``
    (groups packed onto nodes by load, then replication and packing within each node, so a token's experts
    stay on few nodes); global (one group, one node) otherwise."""
    load = np.asarray(load, dtype=np.float64)
    num_experts = load.shape[0]
    if num_physical % num_ranks or num_physical < num_experts:
        raise ValueError(f"{num_physical} expert slots cannot hold {num_experts} experts evenly over {num_ranks} ranks")
    hierarchical = num_nodes > 1 and num_groups % num_nodes == 0 and num_experts % num_groups == 0 \
        and num_ranks % num_nodes == 0 and num_physical % num_nodes == 0
    if not hierarchical:
        return _place(load, num_physical, num_ranks)
    group_size = num_experts // num_groups
    group_node = balanced_packing(load.reshape(num_groups, group_size).sum(1), num_nodes)
    slots_per_node, ranks_per_node = num_physical // num_nodes, num_ranks // num_nodes
    out = []
    for node in range(num_nodes):
        experts = np.concatenate([np.arange(g * group_size, (g + 1) * group_size) for g in np.nonzero(group_node == node)[0]])
        out.append(experts[_place(load[experts], slots_per_node, ranks_per_node)])
    return np.concatenate(out)


def rank_loads(physical_to_logical: np.ndarray, load: np.ndarray, num_ranks: int) -> np.ndarray:
    """The load each rank carries under a map, each expert's load split evenly over its replicas."""
    replicas = np.bincount(physical_to_logical, minlength=load.shape[0])
    per_slot = load[physical_to_logical] / replicas[physical_to_logical]
    return per_slot.reshape(num_ranks, -1).sum(1)


def plan_layer(load: np.ndarray, current: np.ndarray, num_ranks: int, num_nodes: int = 1, num_groups: int = 1) -> tuple[np.ndarray, float, float]:
    """The map a rebalance applies for the logical experts' ``load`` given the ``current`` map: DeepSeek's, unless
    it balances this load no better than the current one (then the current one, and nothing moves). Returns it
    with the balancedness of the current map and of the returned one on this load, so the second is never lower."""
    before = balancedness(rank_loads(current, load, num_ranks))
    proposed = rebalance_experts(load, len(current), num_ranks, num_groups, num_nodes)
    after = balancedness(rank_loads(proposed, load, num_ranks))
    return (proposed, before, after) if after > before else (np.asarray(current).copy(), before, before)


def balancedness(per_rank: np.ndarray) -> float:
    """Mean over max of the ranks' loads: 1.0 is perfect balance; 1.0 too when nothing ran."""
    top = float(np.max(per_rank)) if len(per_rank) else 0.0
    return float(np.mean(per_rank)) / top if top > 0 else 1.0


# ---------------------------------------------------------------------------------------------- rebalancing


def nodes_in_blocks(hosts: list[str]) -> int:
    """The number of nodes when the EP ranks fill them in equal consecutive blocks (what the hierarchical
    placement assumes: rank r on node r // ranks_per_node); 1 otherwise, so that placement is global."""
    blocks = [host for i, host in enumerate(hosts) if i == 0 or hosts[i - 1] != host]
    if len(set(blocks)) != len(blocks) or len(hosts) % len(blocks):
        return 1
    per_node = len(hosts) // len(blocks)
    return len(blocks) if all(hosts[i] == blocks[i // per_node] for i in range(len(hosts))) else 1


@dataclass
class RebalanceReport:
    balancedness_before: float  # measured over the window
    balancedness_after: float  # the new maps on the same window
    seconds: float
    moved_experts: int  # expert copies that crossed ranks


class Rebalancer:
    """Steps one rank's layers through the window and rebalances them every ``step_interval`` steps. Every rank
    of the stage calls ``step()`` after each forward pass (the ranks step together under expert parallelism)."""

    def __init__(self, layers: list[nn.Module], eplb: GroupCoordinator, window_size: int, step_interval: int,
                 log_balancedness: bool = False, num_groups: int = 1) -> None:
        """``num_groups``: the model's expert groups (DeepSeek's ``n_group``; 1 for models without)."""
        self.layers = layers  # FusedExperts modules: .map (ExpertMap), .w13, .w2
        self.group = eplb
        self.window_size, self.step_interval = window_size, step_interval
        self.log_balancedness = log_balancedness
        self.num_groups = num_groups
        self.num_nodes = nodes_in_blocks(eplb.all_gather_object(socket.gethostname()))
        self.num_steps = 0
        self.reports: list[RebalanceReport] = []

    @classmethod
    def for_model(cls, model: nn.Module, eplb) -> "Rebalancer":
        """The rebalancer of ``model``'s MoE layers under ``eplb`` (config.EPLBConfig), on the stage's EPLB group."""
        layers = expert_layers(model)
        hf = model.config
        groups = getattr(hf, "n_group", None) or getattr(hf, "num_expert_group", None) or 1
        return cls(layers, get_parallel_state().eplb, eplb.window_size, eplb.step_interval, eplb.log_balancedness, groups)

    def step(self) -> RebalanceReport | None:
        """After a forward pass: the next window row, and a rebalance when one is due."""
        self.num_steps += 1
        if self.log_balancedness:
            logger.info("EPLB step %d balancedness %.3f", self.num_steps, self.measured_balancedness(rows=[self._row]))
        row = self.num_steps % self.window_size
        for layer in self.layers:
            layer.map.window_row = row
        if self.num_steps % self.step_interval == 0:
            return self.rebalance()
        return None

    @property
    def _row(self) -> int:
        return self.layers[0].map.window_row if self.layers else 0

    def _global_loads(self, rows: list[int] | None = None) -> np.ndarray:
        """Tokens per physical slot over the window (or its ``rows``), summed over the EP ranks: ``[layers, P]``."""
        maps = [layer.map for layer in self.layers]
        P = maps[0].num_physical
        local = torch.zeros(len(maps), P, dtype=torch.int64, device=maps[0].window.device)
        for i, m in enumerate(maps):
            window = m.window if rows is None else m.window[rows]
            local[i, m.first_slot : m.first_slot + m.slots] = window.sum(0)
        if self.group.world_size > 1:
            dist.all_reduce(local, group=self.group.device_group)
        return local.cpu().numpy()

    def measured_balancedness(self, rows: list[int] | None = None) -> float:
        """Mean over the layers of each layer's balancedness over the window (or its ``rows``)."""
        if not self.layers:
            return 1.0
        loads = self._global_loads(rows)
        ranks = self.group.world_size
        return float(np.mean([balancedness(layer_load.reshape(ranks, -1).sum(1)) for layer_load in loads]))

    @torch.inference_mode()
    def rebalance(self) -> RebalanceReport:
        start = time.perf_counter()
        ranks = self.group.world_size
        physical_loads = self._global_loads()
        before, after, moved = [], [], 0
        for layer, slot_load in zip(self.layers, physical_loads):
            m = layer.map
            logical = np.bincount(m.host_map, weights=slot_load, minlength=m.num_experts)
            before.append(balancedness(slot_load.reshape(ranks, -1).sum(1)))  # as measured
            new_map, _, expected = plan_layer(logical, m.host_map, ranks, self.num_nodes, self.num_groups)
            after.append(expected)
            if np.array_equal(new_map, m.host_map):
                continue
            moved += self._move_weights(layer, m.host_map, new_map)
            m.commit(new_map)
            m.window.zero_()  # the slots now hold other experts; their counts start over
        if self.layers and self.layers[0].map.window.is_cuda:
            torch.cuda.synchronize()
        report = RebalanceReport(float(np.mean(before)) if before else 1.0, float(np.mean(after)) if after else 1.0,
                                 time.perf_counter() - start, moved)
        self.reports.append(report)
        logger.info("EPLB rebalance %d: balancedness %.3f -> %.3f, %d experts moved between ranks, %.3f s",
                    len(self.reports), report.balancedness_before, report.balancedness_after, moved, report.seconds)
        return report

    def _move_weights(self, layer: nn.Module, old_map: np.ndarray, new_map: np.ndarray) -> int:
        """Fill each of this rank's slots with its new expert's weights: from a slot of its own that holds the
        expert now, else from the first slot (in slot order) that holds it on another rank. Every rank computes
        the same plan, and each pair of ranks exchanges its tensors in slot order. Returns the copies sent
        between ranks (over the whole stage)."""
        me, S = self.group.rank_in_group, layer.map.slots
        params = [layer.w13, layer.w2]
        new_local = [torch.empty_like(p.data) for p in params]
        ops, crossed = [], 0
        for slot in range(len(new_map)):
            owner, expert = slot // S, int(new_map[slot])
            owner_old = old_map[owner * S : (owner + 1) * S]
            if expert in owner_old:  # already on the rank: a local copy
                if owner == me:
                    source = int(np.nonzero(owner_old == expert)[0][0])
                    for new, p in zip(new_local, params):
                        new[slot - me * S].copy_(p.data[source])
                continue
            source_slot = int(np.nonzero(old_map == expert)[0][0])
            source = source_slot // S
            crossed += 1
            if source == me:
                for p in params:
                    ops.append(dist.P2POp(dist.isend, p.data[source_slot - me * S].contiguous(), self.group.ranks[owner], self.group.device_group))
            elif owner == me:
                for new in new_local:
                    ops.append(dist.P2POp(dist.irecv, new[slot - me * S], self.group.ranks[source], self.group.device_group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        for new, p in zip(new_local, params):
            p.data.copy_(new)
        return crossed
