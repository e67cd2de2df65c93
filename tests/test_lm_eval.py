"""lm-eval-harness 0.4 against `raygrid serve`, as users run it: the `local-completions` model on a small local
multiple-choice task (a jsonl written here, no download). lm-eval scores each choice by sending the context and
the choice as one prompt with echo and logprobs, and reading the choice's prompt-token logprobs back; the test
checks those numbers against the offline engine's prompt logprobs for the same tokens."""

from __future__ import annotations

import json
import random

import pytest

from raygrid import LLM, SamplingParams

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is a test dependency; install raygrid[test]")

QUESTIONS = [
    ("The sky on a clear day is", ["blue", "green", "loud"]),
    ("Two plus two is", ["four", "five", "seven"]),
    ("A cat says", ["meow", "woof", "moo"]),
    ("Water freezes at zero degrees", ["Celsius", "Kelvin"]),
    ("The opposite of hot is", ["cold", "warm", "tall", "red"]),
    ("Paris is the capital of", ["France", "Spain", "Japan"]),
]

TASK_YAML = """\
task: raygrid_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def test_lm_eval_local_completions_scores_choices_with_the_engines_logprobs(qwen3_dir, tokenizer, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    from tests.test_openai_server import start_server, stop_server

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rng = random.Random(0)
    data = tmp_path / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": c, "answer": rng.randrange(len(c))}) + "\n" for q, c in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "raygrid_tiny_mc.yaml").write_text(TASK_YAML.format(data=data))

    proc, base = start_server(qwen3_dir)
    try:
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=f"model=tiny,base_url={base}/v1/completions,tokenizer_backend=huggingface,tokenizer={qwen3_dir},"
                       "num_concurrent=1,max_retries=1",
            tasks=["raygrid_tiny_mc"], task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
        )
    finally:
        stop_server(proc)

    samples = results["samples"]["raygrid_tiny_mc"]
    assert len(samples) == len(QUESTIONS)
    # The truth: each choice's tokens' logprobs after the context, from the offline engine's prompt logprobs.
    offline = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256)
    try:
        correct = 0
        for sample in samples:
            doc = sample["doc"]
            context = tokenizer.encode(doc["question"])
            expected = []
            for choice in doc["choices"]:
                whole = tokenizer.encode(doc["question"] + " " + choice)  # lm-eval's default target delimiter
                assert whole[: len(context)] == context  # the choice's tokens follow the context's
                scored = offline.generate({"prompt_token_ids": whole}, SamplingParams(max_tokens=1, prompt_logprobs=0),
                                          use_tqdm=False)[0].prompt_logprobs
                expected.append(sum(scored[i][whole[i]].logprob for i in range(len(context), len(whole))))
            got = [resp[0][0] for resp in sample["resps"]]  # (loglikelihood, is_greedy) per choice
            assert got == pytest.approx(expected, abs=1e-3)
            best = max(range(len(expected)), key=expected.__getitem__)
            assert sample["acc"] == float(best == doc["answer"])
            correct += best == doc["answer"]
    finally:
        offline.shutdown()
    assert results["results"]["raygrid_tiny_mc"]["acc,none"] == pytest.approx(correct / len(QUESTIONS))
