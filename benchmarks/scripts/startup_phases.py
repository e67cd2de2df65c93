"""Where an engine replica's start goes (what a rebuild after a failure waits for), on one GPU:
python benchmarks/scripts/startup_phases.py [MODEL] > OUT.log

The engine's own log lines, stamped with the milliseconds since this script began, then the seconds of: the
imports, an engine in this process (EngineCore with the model, KV sizing and decode graphs), Ray's start, and
one replica on Ray (a DriverActor and its worker as new processes: what a rebuild does).
"""

import logging
import sys
import time

logging.basicConfig(level=logging.INFO, format="%(relativeCreated)8.0f ms  %(name)s: %(message)s")
model = sys.argv[1] if len(sys.argv) > 1 else "random-qwen3-0.6b"
phases = {}
t = time.perf_counter()
from raygrid import LLM  # noqa: E402

phases["import raygrid"] = time.perf_counter() - t
t = time.perf_counter()
llm = LLM(model=model)
phases["engine in this process"] = time.perf_counter() - t
llm.shutdown()
del llm
import ray  # noqa: E402

t = time.perf_counter()
ray.init(log_to_driver=False)
phases["ray.init (a local cluster)"] = time.perf_counter() - t
for attempt in (1, 2):  # the second start is a rebuild's: the cluster is up, its worker processes warm
    t = time.perf_counter()
    llm = LLM(model=model, distributed_executor_backend="ray")
    phases[f"one replica on Ray, start {attempt}"] = time.perf_counter() - t
    llm.shutdown()
    del llm
for name, seconds in phases.items():
    print(f"{name:<36}{seconds:8.2f} s")
