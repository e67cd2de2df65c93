"""Arrival counters: how the programs of one launch learn which of them finished a shared piece of work last.

A launch that splits a reduction over several programs (split-K in the skinny linear kernel, context slices in
decode attention) lets each program store its partial result and then add 1 to the piece's counter; the program
that sees the count reach its last value sums the partials in the same launch and sets the counter back to 0.
That saves the second kernel a reduction would otherwise take, and its launch.

One counter buffer a device, all 0 between launches, kept for the process's life (as cuBLAS keeps its workspaces):
CUDA graphs captured with such launches hold its address. Launches one after another on a stream share it, since each
leaves its counters at 0; two streams running such launches on one device at once would race, and raygrid runs a
device's forward passes on one stream. The buffer is made by the first launch outside a capture (the graphs' warm-up
runs); a launch captured before that gets None and reduces without counters.
"""

from __future__ import annotations

import torch

MAX_COUNTERS = 16384  # 64 KiB a device
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, needed: int) -> torch.Tensor | None:
    """``needed`` counters at 0 on ``device`` (the start of the device's buffer), or None where there cannot be any:
    more than MAX_COUNTERS, or the buffer not made yet and a CUDA graph being captured."""
    if needed > MAX_COUNTERS:
        return None
    counters = _COUNTERS.get(device)
    if counters is None and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        counters = _COUNTERS[device] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
    return counters
