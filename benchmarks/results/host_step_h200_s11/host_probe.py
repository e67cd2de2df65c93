"""Session 11: where a batch-1 decode step's time goes at 512 tokens (host or GPU), with and without the one-launch pass."""
import cProfile, io, json, os, pstats, sys, time
import numpy as np
import torch
from raygrid.bench.latency import time_raygrid
from raygrid.bench.profile_decode import profile_decode
from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.llm_engine import LLMEngine
from raygrid.engine import pending_output
from raygrid.models.default_model import resolve_model_path

out = sys.argv[1]
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 512
print("affinity", len(os.sched_getaffinity(0)), "torch threads", torch.get_num_threads(), "loadavg", open("/proc/loadavg").read().strip())
print([l for l in open("/proc/cpuinfo") if l.startswith("model name")][0].strip())
waits = []
orig_result = pending_output.PendingRunnerOutput.result
def timed_result(self):
    t = time.perf_counter(); r = orig_result(self); waits.append(time.perf_counter() - t); return r
pending_output.PendingRunnerOutput.result = timed_result
report = {}
rng = np.random.default_rng(0)
for setting in sys.argv[3].split(","):
    engine = LLMEngine.from_engine_args(EngineArgs(model=resolve_model_path("random-qwen3-0.6b"), dtype="bfloat16",
                                                   max_model_len=ctx + 600, persistent_decode=(setting == "on")))
    n = int(os.environ.get("N", 256))
    time_raygrid(engine, [rng.integers(0, 10000, ctx).tolist()], 64)
    rows = []
    for i in range(4):
        waits.clear()
        prof = cProfile.Profile() if i == 3 else None
        if prof: prof.enable()
        ttft, e2e = time_raygrid(engine, [rng.integers(0, 10000, ctx).tolist()], n)[0]
        if prof:
            prof.disable(); s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
            open(f"{out}/cprofile_{setting}_{ctx}.txt", "w").write(s.getvalue())
        w = np.array(waits[2:])
        rows.append(dict(tpot_ms=(e2e - ttft) / (n - 1) * 1e3, ttft_ms=ttft * 1e3, wait_ms_median=float(np.median(w) * 1e3),
                         wait_ms_mean=float(w.mean() * 1e3), profiled=bool(prof)))
        print(setting, ctx, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    try:
        prof_summary = profile_decode(engine, f"{out}/prof_{setting}", num_reqs=1, prompt_len=ctx, steps=30)
    except Exception as e:  # noqa: BLE001
        prof_summary = {"error": repr(e)}
        print("profile failed", repr(e))
    report[setting] = dict(runs=rows, profile={k: v for k, v in prof_summary.items() if k != "top_kernels"},
                           top_kernels=prof_summary.get("top_kernels", [])[:12])
    engine.shutdown()
    del engine
json.dump(report, open(f"{out}/host_probe_{ctx}.json", "w"), indent=1)
