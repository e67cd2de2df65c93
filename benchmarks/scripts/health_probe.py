"""Poll a server's /health every 50 ms until SIGTERM, then write the latencies' percentiles as JSON, and when
each probe over 50 ms began (Unix time), to line them up with other logs (gc_pauses/sitecustomize.py's).
    python benchmarks/scripts/health_probe.py http://127.0.0.1:8000 OUT.json"""

from __future__ import annotations

import json
import signal
import sys
import time

import httpx

url, out = sys.argv[1].rstrip("/") + "/health", sys.argv[2]
latencies: list[float] = []
slow: list[tuple[float, float]] = []  # (Unix time at the start, ms) of probes over 50 ms
failures = 0


def finish(*_):
    ordered = sorted(latencies) or [0.0]
    pick = lambda p: ordered[min(len(ordered) - 1, int(p / 100 * (len(ordered) - 1)))] * 1000  # noqa: E731
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"probes": len(latencies), "failures": failures, "p50_ms": pick(50), "p99_ms": pick(99), "max_ms": ordered[-1] * 1000,
                   "slow": slow}, f, indent=2)
    sys.exit(0)


signal.signal(signal.SIGTERM, finish)
with httpx.Client(timeout=10) as client:
    while True:
        start, wall = time.perf_counter(), time.time()
        try:
            ok = client.get(url).status_code == 200
        except httpx.HTTPError:
            ok = False
        latencies.append(time.perf_counter() - start)
        if latencies[-1] > 0.05:
            slow.append((wall, latencies[-1] * 1000))
        failures += not ok
        time.sleep(0.05)
