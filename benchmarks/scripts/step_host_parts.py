"""A lone request's decode step on the host, part by part: the scheduler, the persistent batch, the step's inputs,
the forward pass, the sampler's inputs (``SamplingInputs.build``) and the sampler, the scheduler's update and the
output processing; medians over the steps of one request, greedy and sampled. On a CPU the forward pass and the
sampler compute too; the other parts are the host's work on any machine.

    python benchmarks/scripts/step_host_parts.py OUT.json [--model DIR] [--input-len 512] [--output-len 400]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from prompt_admission import git_commit, time_calls, tiny_model

PARTS = [  # (module, class, method, label)
    ("scheduler", "Scheduler", "schedule", "schedule"),
    ("model_runner", "ModelRunner", "_update_states", "_update_states"),
    ("model_runner", "ModelRunner", "_prepare_inputs", "_prepare_inputs"),
    ("model_runner", "ModelRunner", "forward", "forward"),
    ("sampling_inputs", "SamplingInputs", "build", "sampling_inputs.build"),
    ("sampler", "Sampler", "__call__", "sampler"),
    ("model_runner", "ModelRunner", "execute_model", "execute_model"),
    ("scheduler", "Scheduler", "update_from_output", "update_from_output"),
    ("output_processor", "OutputProcessor", "process", "output_processor.process"),
    ("llm_engine", "LLMEngine", "step", "step"),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--model", default=None, help="a checkpoint directory (default: a tiny Qwen3 made here)")
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=400)
    args = parser.parse_args()

    import importlib

    from raygrid import LLM, SamplingParams

    times: dict[str, list[float]] = {label: [] for *_, label in PARTS}
    for module, cls_name, method, label in PARTS:
        time_calls(getattr(importlib.import_module(f"raygrid.engine.{module}"), cls_name), method, times[label], scale=1e6)
    max_len = args.input_len + args.output_len + 8
    llm = LLM(model=args.model or str(tiny_model(max(4096, max_len))), max_model_len=max_len)
    ids = [random.randrange(llm.llm_engine.processor.vocab_size) for _ in range(args.input_len)]
    result = {"input_len": args.input_len, "output_len": args.output_len, "git_commit": git_commit(), "us": {}}
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=temperature)
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)  # warm-up
        for samples in times.values():
            samples.clear()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        # The first steps carry the prompt; the medians are over the decode steps.
        result["us"][f"temperature {temperature}"] = {k: round(statistics.median(v[10:]), 1) for k, v in times.items() if v[10:]}
    Path(args.output).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["us"]))
    llm.shutdown()


if __name__ == "__main__":
    main()
