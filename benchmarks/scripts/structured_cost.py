"""The cost of structured outputs on the decode step: N requests decoding under a JSON schema long enough
never to finish, against the same batch unconstrained, in one engine (issue #17's H200 measurement).

    python benchmarks/scripts/structured_cost.py OUT.json [--model random-qwen3-0.6b] [--num-reqs 256] [--prompt-len 512]
        [--rows plain,json_schema,plain_again,json_schema_again]   # KIND@SECONDS: a GIL switch interval; KIND#N: N fill threads

Each row also records where its steps' time went: the grammar thread's timeline (``Timeline``) and the step loop's
phases with their CPU time (``Phases``), printed as one line a row.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

import numpy as np

from raygrid import LLM, SamplingParams
from raygrid.bench.throughput import device_name, git_commit
from raygrid.engine import structured_output
from raygrid.engine.sampling_params import StructuredOutputsParams

# 100 required fields of strings, integers and booleans: hundreds of tokens before the object can close.
FIELD_TYPES = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"})
ENDLESS = {"type": "object", "properties": {f"field_{i:03d}": FIELD_TYPES[i % 3] for i in range(100)},
           "required": [f"field_{i:03d}" for i in range(100)], "additionalProperties": False}
# The same with every string bounded (4 to 32 characters): llguidance's lexer then counts characters, and
# its token-set shortcuts do not apply.
BOUNDED = {**ENDLESS, "properties": {k: ({"type": "string", "minLength": 4, "maxLength": 32} if v == {"type": "string"} else v)
                                     for k, v in ENDLESS["properties"].items()}}


def decode_step_ms(llm: LLM, num_reqs: int, prompt_len: int, steps: int, structured: StructuredOutputsParams | None, tag: str,
                   profile_to: str | None = None) -> dict:
    import cProfile
    import pstats

    import torch

    core = llm.engine
    rng = np.random.default_rng(1)
    params = SamplingParams(temperature=1.0, max_tokens=3 * steps + 600, ignore_eos=True, structured_outputs=structured, detokenize=False)
    ids = []
    for i in range(num_reqs):
        processed = llm.processor.process(f"{tag}-{i}", {"prompt_token_ids": rng.integers(0, min(10000, llm.processor.vocab_size), prompt_len).tolist()}, params)
        for child in processed.children:
            core.add_request(child)
            ids.append(child.request_id)
    while core.stats().num_waiting or core.stats().num_running < num_reqs:
        core.step()
    for _ in range(5):
        core.step()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    endings: dict[str, int] = {}  # finish reason (and error) -> requests: none should end early

    def step() -> list:
        outputs = core.step()
        for o in outputs:
            if o.finish_reason:
                key = f"{o.finish_reason}: {o.error}" if o.error else o.finish_reason
                endings[key] = endings.get(key, 0) + 1
        return outputs

    timeline = Timeline(core) if structured is not None else None
    phases = Phases(core)
    start = time.perf_counter()
    tokens = 0
    marks = [start]
    for _ in range(steps):
        tokens += sum(len(o.new_token_ids) for o in step())
        marks.append(time.perf_counter())
    elapsed = time.perf_counter() - start
    each = np.diff(marks) * 1e3
    grammar = timeline.close() if timeline is not None else None
    phase_stats = phases.close(steps)
    if profile_to:  # where the host's time goes, after the timed steps (the profiler slows what it watches)
        profiler = cProfile.Profile()
        profiler.runcall(lambda: [step() for _ in range(steps)])
        with open(profile_to, "w", encoding="utf-8") as f:
            for key in ("tottime", "cumulative"):
                pstats.Stats(profiler, stream=f).sort_stats(key).print_stats(35)
    running = core.stats().num_running
    core.abort_requests(ids)
    while core.has_unfinished_requests():
        core.step()
    return {"ms_per_step": elapsed / steps * 1e3, "median_ms": float(np.median(each)), "p90_ms": float(np.percentile(each, 90)),
            "max_ms": float(each.max()), "tokens_per_step": tokens / steps, "running_at_end": running, "ended_early": endings,
            "grammar_timeline": grammar, "phases": phase_stats}


class Phases:
    """The step loop's time per step in each of its phases (milliseconds, means over the timed steps): wall
    time, the calling thread's CPU time, and its involuntary context switches (the OS took its core). Where
    a phase's wall grows and its CPU time does not, the thread waited: for the GIL, a lock, the device, or a
    core. Timing wrappers on the engine's scheduler, executor and step outputs, for the timed steps only."""

    def __init__(self, core) -> None:
        from raygrid.engine.pending_output import PendingRunnerOutput

        self.totals: dict[str, list[float]] = {}
        self._undo = []
        for owner, name, label in ((core.scheduler, "schedule", "schedule"), (core.scheduler, "update_from_output", "update"),
                                   (core.executor, "sample_deferred", "sample_launch"),
                                   (core.executor, "execute_model_async", "forward_launch")):
            setattr(owner, name, self._timed(getattr(owner, name), label))
            self._undo.append((owner, name))
        self._cls, self._result = PendingRunnerOutput, PendingRunnerOutput.result
        PendingRunnerOutput.result = self._timed(self._result, "await_tokens")
        self._step_started = self._usage()

    @staticmethod
    def _usage() -> tuple[float, float, int]:
        return time.perf_counter(), time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw

    def _timed(self, fn, label: str):
        def timed(*args, **kwargs):
            before = self._usage()
            try:
                return fn(*args, **kwargs)
            finally:
                after = self._usage()
                total = self.totals.setdefault(label, [0.0, 0.0, 0])
                for i in range(3):
                    total[i] += after[i] - before[i]
        return timed

    def close(self, steps: int) -> dict:
        for owner, name in self._undo:
            delattr(owner, name)
        self._cls.result = self._result
        ended = self._usage()
        whole = [ended[i] - self._step_started[i] for i in range(3)]
        out = {label: {"wall_ms": t[0] / steps * 1e3, "cpu_ms": t[1] / steps * 1e3, "preempted": t[2] / steps}
               for label, t in self.totals.items()}
        named = [sum(t[i] for t in self.totals.values()) for i in range(3)]
        out["rest"] = {"wall_ms": (whole[0] - named[0]) / steps * 1e3, "cpu_ms": (whole[1] - named[1]) / steps * 1e3,
                       "preempted": (whole[2] - named[2]) / steps}
        return out


class Timeline:
    """Where a constrained step's grammar time goes, per step (milliseconds): the grammar thread's advance and
    fill (how long each waited in the thread's queue, and ran), and how long the step loop waited for a mask
    it needed. Timing wrappers around the grammar thread's pool and SchedulerOutput.grammar_bitmask for
    the timed steps only."""

    def __init__(self, core) -> None:
        from raygrid.engine.outputs import SchedulerOutput

        self.records: dict[str, list[tuple[float, float, float]]] = {"advance": [], "fill": []}  # (submitted, started, ended)
        self.waits: list[float] = []
        # The grammar thread queues its work (_advance, _fill) on a one-thread pool: time what that pool runs.
        self._pool = core.scheduler._grammar_thread()._thread
        submit = self._pool.submit

        def timed_submit(fn, *args):
            submitted, kind = time.perf_counter(), fn.__name__.lstrip("_")

            def run(*inner):
                started = time.perf_counter()
                try:
                    return fn(*inner)
                finally:
                    self.records[kind].append((submitted, started, time.perf_counter()))
            return submit(run, *args)
        self._pool.submit = timed_submit
        self._cls, self._bitmask = SchedulerOutput, SchedulerOutput.grammar_bitmask

        def timed_bitmask(so, _original=self._bitmask):
            started = time.perf_counter()
            try:
                return _original(so)
            finally:
                self.waits.append(time.perf_counter() - started)
        SchedulerOutput.grammar_bitmask = timed_bitmask

    def close(self) -> dict:
        del self._pool.submit
        self._cls.grammar_bitmask = self._bitmask

        def stats(values) -> dict:
            values = np.asarray(values) * 1e3
            return {"median": float(np.median(values)), "p90": float(np.percentile(values, 90)), "max": float(values.max()),
                    "mean": float(values.mean())} if len(values) else {}

        out = {"mask_wait_ms": stats(self.waits)}
        for kind, rows in self.records.items():
            out[f"{kind}_queued_ms"] = stats([s - q for q, s, _ in rows])
            out[f"{kind}_ran_ms"] = stats([e - s for _, s, e in rows])
        return out


def row_summary(row: dict) -> str:
    """One line: ms per step; the grammar thread's medians (mask wait, advance, fill); each phase of the step loop as
    wall / CPU ms and involuntary context switches a step."""
    grammar = row["grammar_timeline"] or {}
    medians = " ".join(f"{name} {grammar[key]['median']:.2f}" for name, key in
                       (("wait", "mask_wait_ms"), ("advance", "advance_ran_ms"), ("fill", "fill_ran_ms")) if grammar.get(key))
    phases = " ".join(f"{name}={v['wall_ms']:.2f}/{v['cpu_ms']:.2f}/{v['preempted']:.2f}" for name, v in row["phases"].items())
    return f"{row['ms_per_step']:.2f} ms | {medians or 'no grammar'} | {phases}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="random-qwen3-0.6b")
    parser.add_argument("--num-reqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval for the run, in seconds (how soon a thread waiting for the GIL gets it)")
    parser.add_argument("--rows", default="plain,json_schema,plain_again,json_schema_again,json_schema_bounded_strings")
    parser.add_argument("--profile", action="store_true", help="also profile the host side of each row (OUT.<row>.prof.txt)")
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    llm = LLM(model=args.model, dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
              async_scheduling=args.async_scheduling)
    try:
        schema, bounded = StructuredOutputsParams(json=ENDLESS), StructuredOutputsParams(json=BOUNDED)
        start = time.perf_counter()
        llm.processor.grammars.check(schema)
        compile_s = time.perf_counter() - start

        def parts(tag: str) -> tuple[str, str, str]:  # kind, threads, interval
            kind, _, interval = tag.partition("@")
            kind, _, threads = kind.partition("#")
            return kind, threads, interval

        rows = {}
        default_threads = structured_output.GRAMMAR_THREADS
        kinds = {"plain": None, "json_schema": schema, "plain_again": None, "json_schema_again": schema, "json_schema_bounded_strings": bounded}
        for tag in args.rows.split(","):
            # "KIND@SECONDS" runs that row at that GIL switch interval (with RAYGRID_GRAMMAR_SWITCH_INTERVAL_S=0,
            # so that the engine leaves the interval alone): an A/B of the interval inside one process.
            # "KIND#N" fills the masks on N llguidance threads (a fresh grammar thread for the row).
            kind, threads, interval = parts(tag)
            if interval:
                sys.setswitchinterval(float(interval))
            structured_output.GRAMMAR_THREADS = int(threads) if threads else default_threads
            if llm.engine.scheduler._grammar_work is not None:
                llm.engine.scheduler._grammar_work.shutdown()
                llm.engine.scheduler._grammar_work = None
            if tag in rows:
                raise SystemExit(f"--rows: {tag} twice (name repeats as KIND_again)")
            structured = kinds[kind]
            rows[tag] = decode_step_ms(llm, args.num_reqs, args.prompt_len, args.steps, structured, tag,
                                       f"{args.out}.{tag}.prof.txt" if args.profile else None)
            print(tag, rows[tag], flush=True)
            print(f"  {tag}: {row_summary(rows[tag])}", flush=True)

        def mean_of(kinds_wanted: tuple[str, ...], interval: str | None = None, threads: str | None = None) -> float:
            return np.mean([row["ms_per_step"] for t, row in rows.items() if parts(t)[0] in kinds_wanted
                            and (interval is None or parts(t)[2] == interval) and (threads is None or parts(t)[1] == threads)])

        # Each side's two runs averaged (runs alternate, so drift falls on both sides).
        plain = mean_of(("plain", "plain_again"))
        constrained = mean_of(("json_schema", "json_schema_again"))
        for interval in sorted({parts(t)[2] for t in rows if "@" in t}):
            at = mean_of(("json_schema", "json_schema_again"), interval)
            if not np.isnan(at):
                print(f"JSON schema at a {float(interval) * 1e3:g} ms switch interval: {at:.2f} ms ({(at / plain - 1) * 100:+.1f}% over plain)")
        for threads in sorted({parts(t)[1] for t in rows if "#" in t}, key=int):
            at = mean_of(("json_schema", "json_schema_again"), threads=threads)
            print(f"JSON schema with masks filled on {threads} threads: {at:.2f} ms ({(at / plain - 1) * 100:+.1f}% over plain)")
        result = {"model": args.model, "num_reqs": args.num_reqs, "prompt_len": args.prompt_len, "steps": args.steps, "rows": rows,
                  "schema": ENDLESS, "bounded_schema": BOUNDED, "first_compile_s": compile_s, "plain_ms": plain,
                  "constrained_ms": constrained, "slowdown": constrained / plain,
                  "bounded_slowdown": rows["json_schema_bounded_strings"]["ms_per_step"] / plain if "json_schema_bounded_strings" in rows else None,
                  "switch_interval_s": sys.getswitchinterval(), "machine": device_name(), "git_commit": git_commit(),
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
        print(f"decode step with {args.num_reqs} running: {plain:.2f} ms plain, {constrained:.2f} ms under a JSON schema "
              f"({(constrained / plain - 1) * 100:+.1f}%)")
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
