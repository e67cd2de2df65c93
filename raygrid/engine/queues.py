"""The command queues of the step-loop threads (AsyncLLM's, the Serve engine replica's)."""

from __future__ import annotations

import queue
from collections.abc import Iterator


def drain(commands: queue.SimpleQueue, wait_s: float | None) -> Iterator:
    """What is queued, in order: waiting up to ``wait_s`` for the first (None: not at all), then what is there."""
    try:
        command = commands.get(timeout=wait_s) if wait_s else commands.get_nowait()
    except queue.Empty:
        return
    while True:
        yield command
        try:
            command = commands.get_nowait()
        except queue.Empty:
            return
