"""A custom all-reduce for the ranks of one node: our one-shot and two-shot kernels over peer-visible buffers.

NCCL pays a fixed latency per call that dominates the small all-reduces of tensor-parallel decode (two a
layer). Here every rank owns one buffer its peers can address, allocated and exchanged once, before any CUDA
graph is captured; the kernels (kernels/triton_allreduce.py) copy the input in, meet at flags kept in the same
buffers, and sum the peers' copies in rank order, so every rank gets bitwise the same result.

Where the buffers come from:
- GPUs: torch's symmetric memory (``torch.distributed._symmetric_memory``: allocation, IPC handle exchange
  and mapping of the peers' buffers). Multicast is never used (no multimem instructions, no NVLS).
- CPU processes (tests, under Triton's interpreter): files in /dev/shm mapped by every rank.

The communicator falls back to the group's NCCL (gloo) all-reduce for dtypes other than bf16/fp16/fp32, for
messages above ``max_bytes``, and entirely when the ranks are not all NVLink peers on one host. The first two
depend only on the tensor, which is the same on every rank; the last is agreed at construction. So every rank
always takes the same path, which the flag protocol needs.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import uuid
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class CustomAllReduceLimits:
    """Sizes that pick the path; the defaults are guesses until `raygrid bench allreduce` measures them."""

    max_bytes: int = 8 * 2**20  # larger messages go to NCCL
    one_shot_max_bytes: int = 256 * 2**10  # larger ones take the two-shot kernel
    num_blocks: int = 32  # programs per call (kernels.triton_allreduce.MAX_BLOCKS at most)


class CustomAllReduce:
    """One group's communicator. ``group`` is a parallel.groups.GroupCoordinator; ``enabled`` says whether
    its ranks agreed to use the kernels (if not, ``reason`` says why and every call goes to the group)."""

    def __init__(self, group, device: torch.device, limits: CustomAllReduceLimits | None = None) -> None:
        from raygrid.kernels.triton_allreduce import MAX_BLOCKS, header_bytes

        # Triton's interpreter runs a call's programs one after another: on CPU, one (the case where a rank's next
        # call meets the very elements a slower peer still reads).
        limits = limits or (CustomAllReduceLimits() if device.type == "cuda" else CustomAllReduceLimits(num_blocks=1))
        if not 1 <= limits.num_blocks <= MAX_BLOCKS:
            raise ValueError(f"num_blocks is {limits.num_blocks}; it must be between 1 and {MAX_BLOCKS}")
        self.group, self.device, self.limits = group, device, limits
        self.rank, self.world = group.rank_in_group, group.world_size
        self.header = header_bytes(self.world)
        self._buffers = None
        verdicts = group.all_gather_object(_local_verdict(device, self.world))
        hosts = {host for host, _ in verdicts}
        reasons = [reason for _, reason in verdicts if reason]
        if len(hosts) > 1:
            reasons.append(f"the group spans {len(hosts)} hosts")
        elif device.type == "cuda" and not reasons:
            reasons += _nvlink_gaps(group, device)
        self.reason = reasons[0] if reasons else ""
        self.enabled = not reasons
        if not self.enabled:
            if group.is_first:
                logger.warning("custom all-reduce is off for ranks %s: %s; the group's all-reduce is used", group.ranks, self.reason)
            return
        size = self.header + 2 * limits.max_bytes  # the header, then two halves used by alternate calls
        self._buffers = (_SymmetricBuffers if device.type == "cuda" else _SharedHostBuffers)(group, device, size)
        self.buffer_ptrs = torch.tensor(self._buffers.ptrs, dtype=torch.int64, device=device)

    def can_reduce(self, tensor: torch.Tensor) -> bool:
        return (self.enabled and tensor.dtype in SUPPORTED_DTYPES and tensor.is_contiguous() and tensor.device == self.device
                and tensor.numel() * tensor.element_size() <= self.limits.max_bytes)

    def all_reduce(self, tensor: torch.Tensor, two_shot: bool | None = None) -> torch.Tensor:
        """The group's sum of ``tensor`` in a new tensor (``can_reduce`` must hold). ``two_shot`` forces a kernel
        (benchmarks); by default messages above ``one_shot_max_bytes`` take the two-shot one."""
        from raygrid.kernels.triton_allreduce import launch_all_reduce

        nbytes = tensor.numel() * tensor.element_size()
        if two_shot is None:
            two_shot = nbytes > self.limits.one_shot_max_bytes
        out = torch.empty_like(tensor)
        if tensor.numel():
            launch_all_reduce(two_shot, tensor, out, self.buffer_ptrs, self.limits.max_bytes // tensor.element_size(),
                              self.header, self.rank, self.world, self.limits.num_blocks)
        return out

    def close(self) -> None:
        """Release the buffers (every rank, after its last call)."""
        if self._buffers is not None:
            self._buffers.close()
            self._buffers = None
            self.enabled = False


def _local_verdict(device: torch.device, world: int) -> tuple[str, str]:
    """This rank's host and why it cannot take part ('' if it can)."""
    from raygrid.kernels.triton_allreduce import MAX_PEERS

    reason = ""
    if world > MAX_PEERS:
        reason = f"{world} ranks; the kernels take at most {MAX_PEERS}"
    elif device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        reason = "on CPU the kernels run only under Triton's interpreter (TRITON_INTERPRET=1)"
    elif device.type not in ("cpu", "cuda"):
        reason = f"device type {device.type!r}"
    return socket.gethostname(), reason


def _nvlink_gaps(group, device: torch.device) -> list[str]:
    """Why the group's GPUs are not all NVLink peers of each other (empty if they are), from NVML."""
    uuids = group.all_gather_object(str(torch.cuda.get_device_properties(device).uuid))
    try:
        import pynvml
    except ImportError:
        return ["NVML (the nvidia-ml-py package) is not installed, so NVLink between the GPUs cannot be checked"]
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return [f"NVML could not start ({error}), so NVLink between the GPUs cannot be checked"]
    try:
        handles = [pynvml.nvmlDeviceGetHandleByUUID(u if u.startswith("GPU-") else f"GPU-{u}") for u in uuids]
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                if uuids[i] == uuids[j]:  # two ranks on one GPU (tests): no link to cross
                    continue
                status = pynvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                if status != pynvml.NVML_P2P_STATUS_OK:
                    return [f"GPUs {uuids[i]} and {uuids[j]} are not NVLink peers"]
    finally:
        pynvml.nvmlShutdown()
    return []


class _SymmetricBuffers:
    """One zeroed buffer a rank on every GPU of the group, mapped into each peer by torch's symmetric memory."""

    def __init__(self, group, device: torch.device, size: int) -> None:
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")  # read at torch's first allocation: no NVLS
        from torch.distributed import _symmetric_memory as symm_mem

        self.buffer = symm_mem.empty(size, dtype=torch.uint8, device=device)
        self.buffer.zero_()
        torch.cuda.synchronize(device)
        self.handle = symm_mem.rendezvous(self.buffer, group.cpu_group)  # IPC handles go through the store
        self.ptrs = [int(p) for p in self.handle.buffer_ptrs]
        group.barrier()  # every peer's flags are zero before anyone posts to them

    def close(self) -> None:
        self.handle = self.buffer = None


class _SharedHostBuffers:
    """The same on one host's CPU processes: each rank makes a zeroed file in /dev/shm and maps its peers'; the
    files are unlinked once all have mapped them, so the memory goes with the last process to drop it."""

    def __init__(self, group, device: torch.device, size: int) -> None:
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
        path = os.path.join(folder, f"raygrid-allreduce-{uuid.uuid4().hex}")
        with open(path, "wb") as f:
            f.truncate(size)
        paths = group.all_gather_object(path)
        self.buffers = [torch.from_file(p, shared=True, size=size, dtype=torch.uint8) for p in paths]
        group.barrier()
        os.unlink(path)
        self.ptrs = [b.data_ptr() for b in self.buffers]

    def close(self) -> None:
        self.buffers = []
