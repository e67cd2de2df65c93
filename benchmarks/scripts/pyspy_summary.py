"""Summarize a py-spy raw (collapsed-stack) recording: per process, its share of the samples and the
functions that take the most, by self time (the leaf frame) and inclusive (anywhere on the stack).

    python3 benchmarks/scripts/pyspy_summary.py py-spy_MODE.txt [TOP] > summary.txt
"""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict


def frame_name(frame: str) -> str:
    """'Class.method (path/file.py:123)' -> 'Class.method (file.py)': lines differ per call site."""
    return re.sub(r"\(([^():]*/)?([^/():]+):\d+\)", r"(\2)", frame.strip())


def main(path: str, top: int = 20) -> None:
    processes: dict[str, Counter] = defaultdict(Counter)
    self_time: dict[str, Counter] = defaultdict(Counter)
    inclusive: dict[str, Counter] = defaultdict(Counter)
    for line in open(path, encoding="utf-8", errors="replace"):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        process_frames = [f for f in frames if f.startswith("process ")]
        process = process_frames[-1].split(":", 1)[0] if process_frames else "process ?"
        code = [frame_name(f) for f in frames if not f.startswith("process ") and not f.startswith("thread ")]
        if not code:
            continue
        n = int(count)
        processes[process]["samples"] += n
        self_time[process][code[-1]] += n
        for name in set(code):
            inclusive[process][name] += n
    total = sum(p["samples"] for p in processes.values())
    for process, counts in sorted(processes.items(), key=lambda kv: -kv[1]["samples"]):
        samples = counts["samples"]
        print(f"== {process}: {samples} samples ({100 * samples / total:.1f}% of all)")
        print("  self:")
        for name, n in self_time[process].most_common(top):
            print(f"    {100 * n / samples:5.1f}%  {name}")
        print("  inclusive:")
        for name, n in inclusive[process].most_common(top):
            print(f"    {100 * n / samples:5.1f}%  {name}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
