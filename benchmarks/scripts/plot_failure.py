"""A failure run's numbers and plot (benchmarks/scripts/failure.sh): python plot_failure.py OUT_DIR.

Reads OUT_DIR/bench.json (`raygrid bench serve --save-result`: each request's send time, TTFT and ITLs),
kill.json (when the worker was killed) and server.log (when the replica was back in service). Writes
failure.json (requests completed against sent; TTFT and ITL before the kill, and from the kill until the
rebuilt replica served; the rebuild's seconds) and failure.png (TTFT by send time, ITL by arrival time).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path


def percentile(values: list[float], p: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))] if ordered else None


def describe(values: list[float]) -> dict:
    ms = [v * 1000 for v in values]
    return {"count": len(ms), "median_ms": statistics.median(ms) if ms else None, "p99_ms": percentile(ms, 99),
            "max_ms": max(ms) if ms else None}


def main(out: Path) -> dict:
    bench = json.loads((out / "bench.json").read_text())
    kill_at = json.loads((out / "kill.json").read_text())["unix_time"] - bench["started_unix_time"]
    found = re.search(r"back in service, ([\d.]+) s after it failed", (out / "server.log").read_text())
    rebuild_s = float(found.group(1)) if found else None
    back_at = kill_at + rebuild_s if rebuild_s is not None else None

    ttfts, itls = [], []  # (when, seconds): TTFT by send time, each ITL by its token's arrival
    for start, ttft, gaps in zip(bench["start_times"], bench["ttfts"], bench["itls"]):
        if ttft is None:
            continue
        ttfts.append((start, ttft))
        when = start + ttft
        for gap in gaps:
            when += gap
            itls.append((when, gap))

    def window(points, lo, hi):
        return [v for t, v in points if lo <= t < hi]

    end = back_at if back_at is not None else float("inf")
    result = {
        "sent": bench["num_prompts"], "completed": bench["completed"], "failed": bench["failed"], "errors": bench["errors"],
        "killed_at_s": round(kill_at, 2), "rebuild_s": rebuild_s,
        "ttft_before_kill": describe(window(ttfts, 0, kill_at)),
        "ttft_kill_to_back": describe(window(ttfts, kill_at, end)),
        "ttft_after_back": describe(window(ttfts, end, float("inf"))),
        "itl_before_kill": describe(window(itls, 0, kill_at)),
        "itl_kill_to_back": describe(window(itls, kill_at, end)),
        "itl_after_back": describe(window(itls, end, float("inf"))),
        "output_throughput": bench["output_throughput"],
    }
    (out / "failure.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    try:
        import matplotlib
    except ImportError:
        print("no matplotlib here: run this script again where it is, for failure.png")
        return result

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    top.scatter(*zip(*ttfts), s=4)
    top.set_ylabel("TTFT (s), by send time")
    bottom.scatter(*zip(*itls), s=1, alpha=0.3)
    bottom.set_yscale("log")
    bottom.set_ylabel("ITL (s), by arrival")
    bottom.set_xlabel("seconds since the run began")
    for axis in (top, bottom):
        axis.axvline(kill_at, color="red", label="worker SIGKILLed")
        if back_at is not None:
            axis.axvline(back_at, color="green", label="replica back in service")
    top.legend(loc="upper right")
    top.set_title(f"{bench['completed']}/{bench['num_prompts']} requests completed at {bench['request_rate']:g} req/s")
    fig.tight_layout()
    fig.savefig(out / "failure.png", dpi=120)
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]))
