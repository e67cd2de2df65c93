"""Programmatic dependent launch (PDL; Hopper and later), for the kernels of a decode step.

A decode step at small batch is a chain of about 340 short kernels, each a few microseconds, and between two
of them the GPU drains one grid before it schedules the next, even inside a CUDA graph. A kernel launched with
PDL is scheduled while the kernel before it in the stream is still running: its programs start, then wait at
``griddepcontrol.wait`` until that kernel has finished and its writes are visible. Each kernel that takes part
calls ``pdl_wait`` before it touches memory, then lets the kernel after it launch (``launch_dependents``): so a
chain of them overlaps each kernel's launch with the end of the one before. A kernel without PDL (cuBLAS, torch)
keeps the stream's ordinary order on both sides.

``RAYGRID_PDL=0`` turns it off (benchmarks/README.md measures both); it is off on GPUs before Hopper and with Triton
before 3.3.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

def _triton_has_pdl() -> bool:
    """Triton 3.3 and later: the launch option and the two instructions (older ones run without PDL)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra import cuda
    except ImportError:
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


ENABLED = os.environ.get("RAYGRID_PDL", "1") != "0" and _triton_has_pdl()


@functools.cache
def _capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_launch(device: torch.device) -> dict:
    """The launch arguments of a kernel that calls ``pdl_wait``: its ``PDL`` flag and, where on, Triton's
    ``launch_pdl`` option (never on a CPU, whose interpreter takes no launch options)."""
    on = ENABLED and device.type == "cuda" and _capable(device.index if device.index is not None else torch.cuda.current_device())
    return {"PDL": True, "launch_pdl": True} if on else {"PDL": False}


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """First thing in a kernel launched by ``pdl_launch``: wait for the kernel before it, then let the next start."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
