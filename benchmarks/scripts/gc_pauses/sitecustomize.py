"""Logs every cyclic garbage collection of 5 ms or more, in every Python process started with this folder on
PYTHONPATH and RAYGRID_GC_LOG_DIR set: one JSON line each (Unix time at the start, generation, duration, objects
collected, and the process's command line) in RAYGRID_GC_LOG_DIR/gc_PID.jsonl.

    PYTHONPATH=benchmarks/scripts/gc_pauses:$PYTHONPATH RAYGRID_GC_LOG_DIR=DIR <command>
"""

import gc
import json
import os
import sys
import time

_dir = os.environ.get("RAYGRID_GC_LOG_DIR")
if _dir:
    _started = [0.0, 0.0]

    def _log(phase, info):
        if phase == "start":
            _started[:] = [time.perf_counter(), time.time()]
            return
        seconds = time.perf_counter() - _started[0]
        if seconds >= 0.005:
            with open(os.path.join(_dir, f"gc_{os.getpid()}.jsonl"), "a", encoding="utf-8") as f:
                f.write(json.dumps({"start": _started[1], "generation": info["generation"], "ms": seconds * 1000,
                                    "collected": info["collected"], "argv": " ".join(sys.argv)[:160]}) + "\n")

    os.makedirs(_dir, exist_ok=True)
    gc.callbacks.append(_log)
