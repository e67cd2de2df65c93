"""The host's time from a long prompt's arrival to its first forward pass, part by part, on any machine (no GPU
needed): checking and splitting the request (``InputProcessor.process``), queueing it, the scheduler's first step
(prefix-cache lookup and hashing, block allocation), and the worker's side of that step (the request into the
persistent batch, ``_update_states``; the step's inputs, ``_prepare_inputs``). Each run uses fresh random ids, as a
client's request would bring. Under async scheduling only these come before the GPU starts a prompt: later chunks
are prepared while the one before runs.

    python benchmarks/scripts/prompt_admission.py OUT.json [--model DIR] [--input-len 32768] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import subprocess
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny Qwen3 made here, "
                        "with positions for the prompt)")
    parser.add_argument("--input-len", type=int, default=32768)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=64, help="the GPU's default page")
    args = parser.parse_args()

    from raygrid import LLM, SamplingParams
    from raygrid.engine import model_runner

    model = args.model or str(tiny_model(args.input_len + 8))
    worker_ms: dict[str, list[float]] = {"_update_states": [], "_prepare_inputs": []}
    for name, times in worker_ms.items():  # the first call of each run: the prompt's first chunk
        time_calls(model_runner.ModelRunner, name, times, scale=1e3)
    llm = LLM(model=model, max_model_len=args.input_len + 8, block_size=args.block_size)
    engine = llm.llm_engine
    core, scheduler = engine.engine, engine.engine.scheduler
    params = SamplingParams(max_tokens=1)
    rows = []
    for run in range(args.runs + 2):  # two warm-up runs
        ids = [random.randrange(engine.processor.vocab_size) for _ in range(args.input_len)]
        # Admission and the first schedule, timed apart; then that step is withdrawn.
        start = time.perf_counter()
        processed = engine.processor.process(f"a{run}", {"prompt_token_ids": ids}, params)
        processed_at = time.perf_counter()
        engine.output_processor.add_request(processed)
        for child in processed.children:
            core.add_request(child)
        added_at = time.perf_counter()
        scheduler.schedule()
        scheduled_at = time.perf_counter()
        engine.abort_request(f"a{run}")
        # The same prompt's ids again, fresh, through the whole engine: the worker's side of its first step.
        for times in worker_ms.values():
            times.clear()
        engine.add_request(f"b{run}", {"prompt_token_ids": list(map(int, ids))}, params)
        engine.step()  # its first chunk (the rest is not needed, and on a CPU a 32k prompt's attention takes long)
        engine.abort_request(f"b{run}")
        while engine.has_unfinished_requests():
            engine.step()
        rows.append({"process_ms": (processed_at - start) * 1e3, "add_ms": (added_at - processed_at) * 1e3,
                     "schedule_ms": (scheduled_at - added_at) * 1e3,
                     **{f"{name}_ms": times[0] for name, times in worker_ms.items()}})
    rows = rows[2:]
    medians = {key: round(statistics.median(row[key] for row in rows), 3) for key in rows[0]}
    medians["total_ms"] = round(sum(medians.values()), 3)
    result = {"input_len": args.input_len, "block_size": args.block_size, "model": model, "medians": medians,
              "runs": [{k: round(v, 3) for k, v in row.items()} for row in rows],
              "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}",
              "git_commit": git_commit()}
    Path(args.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(medians))
    llm.shutdown()


def time_calls(cls, method: str, times: list[float], scale: float) -> None:
    """Wrap ``cls.method`` so that each call appends its duration (seconds times ``scale``) to ``times``."""
    original = getattr(cls, method)

    def timed(*a, **k):
        start = time.perf_counter()
        result = original(*a, **k)
        times.append((time.perf_counter() - start) * scale)
        return result

    setattr(cls, method, timed)


def tiny_model(max_len: int) -> Path:
    """The tests' tiny Qwen3 with positions up to ``max_len``, made once under RAYGRID_CACHE."""
    from raygrid.models.default_model import build_tokenizer, cache_dir, tiny_qwen3_config, write_random_checkpoint

    path = cache_dir() / "models" / f"bench-tiny-qwen3-{max_len}"
    if not (path / "config.json").is_file():
        tokenizer = build_tokenizer()
        write_random_checkpoint(path, tiny_qwen3_config(tokenizer, max_position_embeddings=max_len), tokenizer, seed=1)
    return path


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
