"""Where a long prompt's time to first token goes, without a profiler: the host's time before the GPU starts, each
forward pass's GPU time, the GPU's gaps between them, sampling, and the time from the GPU's last work to the token
on the host. Where NVML is installed, a thread also samples the SM clock and the power draw every millisecond while
each request runs. ``raygrid bench latency``'s TTFT is timed the same way (from ``add_request`` to the step that returns
the token); here CUDA events are recorded around ``ModelRunner.forward`` and ``ModelRunner._sample`` as well, so
the TTFT splits into GPU work and what is not.

    python benchmarks/scripts/ttft_timeline.py OUT.json [--input-len 32768] [--runs 6]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


class ClockSampler:
    """The SM clock (MHz) and power (W) of GPU 0, sampled every millisecond by a thread between start() and stop():
    their minimum, median and maximum. Nothing where NVML (``pynvml``) is not installed."""

    def __init__(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 (no NVML: no clocks)
            self.nvml = None
        self.thread = None

    def start(self) -> None:
        import threading

        if self.nvml is None:
            return
        self.samples, self.running = [], True

        def sample():
            while self.running:
                self.samples.append((self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM),
                                     self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1e3))
                time.sleep(0.001)

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()

    def stop(self) -> dict:
        if self.thread is None:
            return {}
        self.running = False
        self.thread.join()
        self.thread = None
        sm, watts = np.array([s[0] for s in self.samples]), np.array([s[1] for s in self.samples])
        return {"sm_mhz_min_median_max": [int(sm.min()), int(np.median(sm)), int(sm.max())],
                "power_w_min_median_max": [round(float(w), 1) for w in (watts.min(), np.median(watts), watts.max())],
                "samples": len(sm)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--input-len", type=int, default=32768)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    import torch

    from raygrid import SamplingParams
    from raygrid.bench.latency import _Prompts
    from raygrid.bench.throughput import provenance
    from raygrid.engine import model_runner
    from raygrid.engine.arg_utils import EngineArgs
    from raygrid.engine.llm_engine import LLMEngine

    on_gpu = torch.cuda.is_available()

    class HostEvent:
        """On a CPU (a smoke test of this script) the host's clock stands in for the GPU's."""

        def record(self):
            self.at = time.perf_counter()

        def elapsed_time(self, other):
            return (other.at - self.at) * 1e3

    def event():
        return torch.cuda.Event(enable_timing=True) if on_gpu else HostEvent()

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    marks: list[tuple[str, float, object, object]] = []
    clocks = ClockSampler() if on_gpu else None

    def timed(name, method):
        def wrapper(*a, **k):
            host = time.perf_counter()
            begin, end = event(), event()
            begin.record()
            out = method(*a, **k)
            end.record()
            marks.append((name, host, begin, end))
            return out
        return wrapper

    model_runner.ModelRunner.forward = timed("forward", model_runner.ModelRunner.forward)
    model_runner.ModelRunner._sample = timed("sample", model_runner.ModelRunner._sample)

    engine = LLMEngine.from_engine_args(EngineArgs(
        model=args.model, dtype=args.dtype, max_model_len=args.input_len + 8,
        max_num_batched_tokens=args.max_num_batched_tokens))
    prompts = _Prompts(0, engine.processor.vocab_size)  # ids below 10,000 at most, as bench latency draws them
    params = SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True, detokenize=False)
    runs = []
    for run in range(args.runs + 1):  # the first is a warm-up
        marks.clear()
        sync()
        if clocks:
            clocks.start()
        zero = event()
        zero.record()
        start = time.perf_counter()
        engine.add_request(engine.next_request_id(), {"prompt_token_ids": prompts.batch(1, args.input_len)[0]}, params)
        added = time.perf_counter()
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs and out.outputs[0].token_ids:
                    first = time.perf_counter()
        sync()
        sampled = clocks.stop() if clocks else {}
        # the passes up to the first token: the prompt's chunks and the sampling of its token
        upto = [m for m in marks if m[1] < first]
        gpu = [(name, zero.elapsed_time(b), zero.elapsed_time(e)) for name, _, b, e in upto]
        forwards = [(s, e) for name, s, e in gpu if name == "forward"]
        row = {
            "ttft_ms": (first - start) * 1e3,
            "add_request_ms": (added - start) * 1e3,
            "host_to_first_forward_call_ms": (upto[0][1] - start) * 1e3,
            "gpu_first_forward_starts_ms": forwards[0][0],
            "forward_gpu_ms": [round(e - s, 3) for s, e in forwards],
            "gaps_between_forwards_ms": [round(b[0] - a[1], 3) for a, b in zip(forwards, forwards[1:])],
            "sample_gpu_ms": [round(e - s, 3) for name, s, e in gpu if name == "sample"],
            "gpu_last_end_ms": max(e for _, _, e in gpu),
        }
        row["token_on_host_after_gpu_ms"] = row["ttft_ms"] - row["gpu_last_end_ms"]
        row["gpu_forward_total_ms"] = sum(row["forward_gpu_ms"])
        row.update(sampled)
        if run:
            runs.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    summary = {k: float(np.median([r[k] for r in runs])) for k in runs[0] if not isinstance(runs[0][k], list)}
    print("medians:", json.dumps({k: round(v, 3) for k, v in summary.items()}), flush=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump({**provenance(), "input_len": args.input_len, "runs": runs, "medians": summary}, f, indent=1)
    engine.shutdown()


if __name__ == "__main__":
    main()
