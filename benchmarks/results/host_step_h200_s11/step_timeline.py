"""Session 11: a batch-1 decode step's timeline at CTX tokens: host phases (perf_counter) and the GPU's start and
end of each step (CUDA events, aligned to the host clock at an idle GPU), with and without the one-launch pass."""
import json, os, sys, time
import numpy as np
import torch
from raygrid.bench.latency import time_raygrid
from raygrid.engine.arg_utils import EngineArgs
from raygrid.engine.llm_engine import LLMEngine
from raygrid.engine import model_runner, pending_output, core, scheduler, output_processor
from raygrid.models.default_model import resolve_model_path

out, ctx, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
env_note = os.environ.get("NOTE", "")
rec = {"on": False, "ev": [], "host": []}

def wrap(cls, name, tag):
    orig = getattr(cls, name)
    def f(self, *a, **k):
        if not rec["on"]:
            return orig(self, *a, **k)
        t = time.perf_counter()
        r = orig(self, *a, **k)
        rec["host"].append((tag, t, time.perf_counter()))
        return r
    setattr(cls, name, f)

orig_exec = model_runner.ModelRunner._execute
def timed_exec(self, so, defer_grammar=False):
    if not rec["on"]:
        return orig_exec(self, so, defer_grammar)
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    t = time.perf_counter(); s.record()
    r = orig_exec(self, so, defer_grammar)
    e.record(); rec["ev"].append((t, time.perf_counter(), s, e))
    return r
model_runner.ModelRunner._execute = timed_exec
wrap(core.EngineCore, "step", "step")
wrap(scheduler.Scheduler, "schedule", "schedule")
wrap(scheduler.Scheduler, "update_from_output", "update")
wrap(pending_output.PendingRunnerOutput, "result", "result")
wrap(model_runner.ModelRunner, "_prepare_inputs", "prepare")
wrap(model_runner.ModelRunner, "_update_states", "update_states")
wrap(model_runner.ModelRunner, "_sample", "sample")
wrap(output_processor.OutputProcessor, "process", "outputs")
from raygrid.engine import llm_engine
wrap(llm_engine.LLMEngine, "step", "llm_step")

def thread_cpu():
    """CPU seconds of each thread of this process so far: {tid: (name, seconds)}."""
    ticks = os.sysconf("SC_CLK_TCK"); res = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]; fields = stat[stat.rindex(")") + 2:].split()
        res[tid] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return res


report = {}
rng = np.random.default_rng(0)
for setting in settings:
    engine = LLMEngine.from_engine_args(EngineArgs(model=resolve_model_path("random-qwen3-0.6b"), dtype="bfloat16",
                                                   max_model_len=ctx + 600, persistent_decode=(setting == "on")))
    n = 200
    time_raygrid(engine, [rng.integers(0, 10000, ctx).tolist()], 64)
    rows = []
    for it in range(2):
        torch.cuda.synchronize()
        base = torch.cuda.Event(enable_timing=True); base.record(); t0 = time.perf_counter(); torch.cuda.synchronize()
        cpu0 = thread_cpu(); w0 = time.perf_counter()
        rec.update(on=True, ev=[], host=[])
        ttft, e2e = time_raygrid(engine, [rng.integers(0, 10000, ctx).tolist()], n)[0]
        rec["on"] = False
        wall = time.perf_counter() - w0; cpu1 = thread_cpu()
        busy = {f"{tid}:{name}": round((c - cpu0.get(tid, (name, 0))[1]) / wall, 3) for tid, (name, c) in cpu1.items()}
        busy = {k: v for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v > 0.02}
        torch.cuda.synchronize()
        ev = rec["ev"][5:-3]  # decode steps only
        h_start = np.array([(a - t0) * 1e3 for a, _, _, _ in ev]); h_end = np.array([(b - t0) * 1e3 for _, b, _, _ in ev])
        g_start = np.array([base.elapsed_time(s) for _, _, s, _ in ev]); g_end = np.array([base.elapsed_time(e) for _, _, _, e in ev])
        phases = {}
        for tag, a, b in rec["host"]:
            phases.setdefault(tag, []).append((b - a) * 1e3)
        med = lambda x: round(float(np.median(x)), 4)
        row = dict(tpot_ms=(e2e - ttft) / (n - 1) * 1e3,
                   step_period_ms=med(np.diff(h_start)), launch_host_ms=med(h_end - h_start),
                   gpu_step_ms=med(g_end - g_start), gpu_idle_between_ms=med(g_start[1:] - g_end[:-1]),
                   queue_lead_ms=med(g_start - h_start), gpu_end_after_launch_end_ms=med(g_end - h_end),
                   thread_cpu_share=busy, phases_ms={k: med(v) for k, v in phases.items()}, phase_calls={k: len(v) for k, v in phases.items()})
        rows.append(row)
        print(setting, ctx, json.dumps(row), flush=True)
    report[setting] = rows
    engine.shutdown(); del engine
json.dump(report, open(f"{out}/step_timeline_{ctx}{env_note}.json", "w"), indent=1)
