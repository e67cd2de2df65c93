"""Text prompts, chat templates, the built-in default model and the `raygrid` command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import sys
from pathlib import Path

import pytest
import torch

from raygrid import LLM, SamplingParams
from raygrid.bench.throughput import make_workload
from raygrid.models.default_model import DEFAULT_MODEL_NAME


def test_text_prompts_and_chat(qwen3_dir, tokenizer):
    llm = LLM(model=qwen3_dir, dtype="float32", device="cpu", max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (out,) = llm.generate("Hello, world!", params, use_tqdm=False)
    assert out.prompt == "Hello, world!" and out.prompt_token_ids == tokenizer.encode("Hello, world!")
    assert out.outputs[0].text == tokenizer.decode(out.outputs[0].token_ids)

    conversation = [{"role": "user", "content": "What is two plus two?"}]
    (chat,) = llm.chat(conversation, params, use_tqdm=False)
    templated = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert templated.endswith("<|im_start|>assistant\n")
    assert chat.prompt_token_ids == tokenizer.encode(templated, add_special_tokens=False)
    assert len(chat.outputs[0].token_ids) == 6
    two = llm.chat([conversation, conversation + [{"role": "assistant", "content": "Four."}, {"role": "user", "content": "And 3+3?"}]], params, use_tqdm=False)
    assert len(two) == 2 and len(two[1].prompt_token_ids) > len(two[0].prompt_token_ids)


def test_default_model_is_built_once_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYGRID_CACHE", str(tmp_path))
    llm = LLM(model=DEFAULT_MODEL_NAME, device="cpu", max_model_len=128)
    path = tmp_path / "models" / DEFAULT_MODEL_NAME
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    assert (path / "tokenizer.json").is_file()
    mtime = (path / "config.json").stat().st_mtime
    (out,) = llm.generate("Once upon a time", SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 5
    LLM(model=DEFAULT_MODEL_NAME, device="cpu", max_model_len=128)
    assert (path / "config.json").stat().st_mtime == mtime  # reused, not rebuilt


def test_cli_generate_runs_the_demo(tmp_path):
    env = dict(os.environ, RAYGRID_CACHE=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "raygrid.entrypoints.cli", "generate", "--prompt", "Hello", "--prompt", "The sky is",
         "--max-tokens", "7", "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("prompt: ") == 2
    assert "7 tokens, finish_reason=length" in result.stdout
    assert "random weights" in result.stderr


def cli(*args: str, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raygrid.entrypoints.cli", *args], capture_output=True, text=True, env=env, timeout=timeout)


def test_cli_reports_bad_arguments_in_one_line_each(tmp_path, qwen3_dir):
    env = dict(os.environ, RAYGRID_CACHE=str(tmp_path))
    bad_temperature = cli("generate", "--prompt", "Hi", "--temperature", "-1", "--device", "cpu", env=env)
    assert bad_temperature.returncode == 2
    assert bad_temperature.stderr.strip() == "error: --temperature: must be >= 0.0 (got -1.0)"
    # An engine flag's limit is checked before torch and the checkpoint load (it took 7 s when they came first).
    bad_engine = subprocess.run([sys.executable, "-c", "import sys; from raygrid.entrypoints.cli import main; "
                                 f"code = main(['generate', '--model', {qwen3_dir!r}, '--prompt', 'Hi', '--max-num-seqs', '0']); "
                                 "print(code, 'torch' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert bad_engine.stdout.strip() == "2 False", bad_engine.stdout
    assert bad_engine.stderr.strip() == "error: --max-num-seqs: must be >= 1 (got 0)"
    unreachable = cli("bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "2")
    assert unreachable.returncode == 2 and "Traceback" not in unreachable.stderr
    assert unreachable.stderr.startswith("error: --base-url http://127.0.0.1:9: cannot reach the server")


def test_serve_finds_a_taken_port_before_loading_the_model(qwen3_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        start = time.monotonic()
        result = cli("serve", "--model", qwen3_dir, "--device", "cpu", "--port", str(port), timeout=60)
    assert result.returncode == 2 and f"--port {port}: cannot listen there" in result.stderr
    assert "Loading" not in result.stderr and time.monotonic() - start < 15


def test_help_answers_without_importing_torch():
    start = time.monotonic()
    result = cli("--help")
    assert result.returncode == 0 and "serve" in result.stdout
    # Every subcommand's parser is built for --help and for any error in the arguments: none may need torch.
    probe = subprocess.run([sys.executable, "-c", "import sys; from raygrid.entrypoints.cli import build_parser; build_parser(); "
                            "print('torch' in sys.modules)"], capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", "the CLI imports torch before it has anything to run"
    assert time.monotonic() - start < 10  # generous for a loaded CI machine; about 0.4 s here


@pytest.mark.parametrize("backend", ["raygrid", "hf"])
def test_cli_bench_throughput_runs_both_backends_on_one_workload(tmp_path, qwen3_dir, backend):
    """`raygrid bench throughput` on CPU: every requested token is generated and counted, and for raygrid
    the per-kind step times add up to the elapsed time. raygrid runs at most 4 requests at once, so prompts keep
    arriving after the first step and the steps with prompt tokens, listed one by one, each start after another."""
    out = tmp_path / "result.json"
    # raygrid: penalties and logprobs on every request, so the benchmark's sampling path is not only the plain one.
    limit = ["--max-num-seqs", "4", "--sampling-params", '{"repetition_penalty": 1.2, "logprobs": 2, "n": 2}'] if backend == "raygrid" else []
    result = subprocess.run(
        [sys.executable, "-m", "raygrid.entrypoints.cli", "bench", "throughput", "--backend", backend, "--model", qwen3_dir,
         "--device", "cpu", "--dtype", "float32", "--num-prompts", "12", "--random-range", "5", "30", "--no-progress",
         "--output-json", str(out), *limit],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    expected_lens = make_workload(12, None, None, (5, 30), seed=0, vocab_size=summary_vocab(qwen3_dir))[1]
    assert summary["output_tokens"] == sum(expected_lens) * (2 if backend == "raygrid" else 1)  # raygrid: n = 2 completions
    assert summary["output_tokens_per_s"] > 0 and "output tok/s" in result.stdout
    if backend == "raygrid":
        assert summary["sampling_params"] == {"temperature": 0.6, "repetition_penalty": 1.2, "logprobs": 2, "n": 2}
        assert summary["max_num_batched_tokens"] == 8192  # the step budget the run had (the default on CPU)
        assert summary["persistent_decode"] is True  # the setting; a lone request takes the pass on one GPU only
        buckets = summary["where_the_time_goes"]
        assert sum(b["steps"] for b in buckets) >= max(expected_lens)  # one token per request a step
        assert sum(b["seconds"] for b in buckets) == pytest.approx(summary["elapsed_s"], rel=0.05)
        prompt_steps = buckets[0]["each"]  # the steps with prompt tokens, one by one
        assert buckets[0]["kind"] == "with prompt tokens" and len(prompt_steps) == buckets[0]["steps"] > 1
        assert sum(step["ms"] for step in prompt_steps) / 1e3 == pytest.approx(buckets[0]["seconds"], abs=0.01)
        assert all(step["tokens"] > step["requests"] > 0 for step in prompt_steps)
        assert buckets[0]["max_ms"] == max(step["ms"] for step in prompt_steps)
        assert all(b["ms_per_step"] <= b["max_ms"] <= 1e3 * b["seconds"] for b in buckets if b["steps"])


@pytest.mark.parametrize("backend", ["raygrid", "hf"])
def test_cli_bench_latency_times_each_prompt_length(tmp_path, qwen3_dir, backend):
    """`raygrid bench latency` on CPU: a row per prompt length, whose first-token, per-token and end-to-end
    times agree with one another, and (raygrid) the gaps between a request's tokens after its first."""
    out = tmp_path / "latency.json"
    command = [sys.executable, "-m", "raygrid.entrypoints.cli", "bench", "latency", "--backend", backend, "--model", qwen3_dir,
               "--device", "cpu", "--dtype", "float32", "--input-len", "16", "48", "--num-iters", "2"]
    result = subprocess.run(command + ["--output-len", "6", "--output-json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(out.read_text())
    assert [row["input_len"] for row in summary["results"]] == [16, 48] and summary["backend"] == backend
    assert summary["max_num_batched_tokens"] == (8192 if backend == "raygrid" else None)  # the CPU's default budget
    assert summary["persistent_decode"] is (True if backend == "raygrid" else None)  # the setting (a GPU's pass only)
    for row in summary["results"]:
        ttft, tpot, e2e = row["ttft_ms"]["median"], row["tpot_ms"]["median"], row["e2e_s"]["median"] * 1e3
        assert 0 < ttft < e2e and tpot > 0
        assert ttft + 5 * tpot == pytest.approx(e2e, rel=0.3)  # medians of the same runs
        assert len(row["ttft_ms"]["each"]) == 2 and min(row["ttft_ms"]["each"]) <= ttft <= max(row["ttft_ms"]["each"])
        assert row["prefill_tflop_per_s"] > 0
        assert row["batch_prefill_ms"]["each"] == row["ttft_ms"]["each"]  # a lone request's prefill is its TTFT
        gaps, steps = row["token_gap_ms"], row["decode_step_ms"]  # gaps: each token's arrival after the first
        if backend == "hf":  # generate() is seen only at its first token and its end: one mean step a run
            assert gaps is None and steps["count"] == 2
        else:
            assert gaps["count"] == 2 * 5 and 0 < gaps["median"] <= gaps["max"]
            assert gaps["first"] <= gaps["max"] and gaps["last"] <= gaps["max"]
            # A request's gaps add up to its time after its first token, so over the two runs (whose medians are
            # their means) the mean gap is the mean time per token, however unevenly a stall spreads them.
            assert 5 * gaps["mean"] == pytest.approx(e2e - ttft, abs=0.01)
            # every step after a lone request's first token decodes the whole batch
            assert (steps["count"], steps["median"], steps["max"]) == (gaps["count"], gaps["median"], gaps["max"])
        # The floor is a GPU's memory bandwidth, measured where the benchmark runs: a CPU run has none.
        assert row["decode_floor_ms"] is None and row["decode_step_over_floor"] is None
    assert summary["copy_bandwidth_bytes_per_s"] is None
    assert "TTFT" in result.stdout and "TPOT" in result.stdout and "floor" not in result.stdout
    assert ("between tokens" in result.stdout) is (backend == "raygrid")


def test_cli_bench_latency_times_a_batch_without_its_prompts_in_the_decode_step(tmp_path, qwen3_dir):
    """A batch of three 48-token prompts under a 32-token step budget: the engine prefills them one after another,
    so the first request's tokens come beside the later prompts' chunks. Each request's TTFT and TPOT count that;
    the batch's prefill runs to the last prompt's first token, its rate counts every prompt over that time, and its
    decode steps are only those where all three decoded."""
    from raygrid.bench.latency import prefill_flops
    from raygrid.models.loader import load_hf_config

    out = tmp_path / "latency.json"
    command = [sys.executable, "-m", "raygrid.entrypoints.cli", "bench", "latency", "--model", qwen3_dir, "--device", "cpu",
               "--dtype", "float32", "--input-len", "48", "--num-iters", "2", "--batch-size", "3",
               "--max-num-batched-tokens", "32", "--output-len", "12", "--output-json", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(out.read_text())["results"]
    ttfts = row["ttft_ms"]["each"]  # run by run, request by request
    assert len(ttfts) == 6 and row["batch_prefill_ms"]["each"] == [max(ttfts[:3]), max(ttfts[3:])]
    assert min(ttfts[:3]) < max(ttfts[:3])  # the prompts were prefilled in turn
    prefill_s = row["batch_prefill_ms"]["median"] / 1e3
    flops = prefill_flops(load_hf_config(qwen3_dir), 48)
    assert row["prefill_tflop_per_s"] == pytest.approx(3 * flops / prefill_s / 1e12, rel=1e-6)
    # Each request's 11 gaps a run; the first request's earliest ones were steps with the later prompts' chunks.
    assert row["token_gap_ms"]["count"] == 2 * 3 * 11
    assert 0 < row["decode_step_ms"]["count"] < 2 * 11
    assert "the batch's prefill" in result.stdout and "decode step" in result.stdout


def test_a_batchs_decode_steps_are_the_steps_after_a_step_that_brought_every_request_a_token():
    """``whole_batch_steps`` on the steps of a batch of 3 (when each step returned, and how many requests it brought a
    token): the prompts' steps, the step that brings the last prompt its first token, and the steps after the first
    request finished are left out; each step of the whole batch is timed from the step before."""
    from raygrid.bench.latency import whole_batch_steps

    ends = [1.0, 2.0, 3.5, 4.0, 4.25, 4.75, 5.0, 5.5, 6.0]
    brought = [0, 1, 2, 3, 3, 3, 3, 2, 1]  # prompts 1 and 2's first tokens; 3's (step 3); request 1 done at step 6
    assert whole_batch_steps(ends, brought, 3) == [0.25, 0.5, 0.25]
    assert whole_batch_steps(ends[:5], brought[:5], 3) == [0.25]
    assert whole_batch_steps([1.0, 2.0, 3.0], [1, 1, 1], 1) == [1.0, 1.0]  # a lone request: every step after its first
    assert whole_batch_steps([1.0, 2.0], [0, 2], 2) == []  # no step of the whole batch yet



def test_cli_bench_latency_refuses_an_output_too_short_to_time(qwen3_dir, capsys):
    from raygrid.entrypoints.cli import main

    assert main(["bench", "latency", "--model", qwen3_dir, "--device", "cpu", "--output-len", "1"]) == 2
    assert "--output-len must be >= 2 (got 1)" in capsys.readouterr().err
    # --sampling-params is checked by SamplingParams as the arguments are parsed, before anything loads.
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "throughput", "--model", qwen3_dir, "--sampling-params", '{"top_p": 1.5}'])
    assert exit_.value.code == 2 and "--sampling-params: top_p: must be <= 1.0 (got 1.5)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "latency", "--model", qwen3_dir, "--sampling-params", '{"max_tokens": 3}'])
    assert "max_tokens is the benchmark's own" in capsys.readouterr().err


def summary_vocab(model_dir: str) -> int:
    return json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]


def test_device_busy_time_is_the_union_of_overlapping_events():
    """`bench latency --profile-dir` reports a step's device busy time as the union of the kernels' intervals: under
    PDL a kernel starts early and waits inside for the one before, and the sum of their times counted that wait
    twice (a 32k decode step read 3.55 ms busy in 1.99 ms of wall time). Checked on a real profile of the host's
    calls, which nest: the union stays below the sum, and the sleep between the calls is not busy. The per-kernel
    table's own times, on two profiled ranges that overlap as PDL's launches do."""
    from torch.profiler import ProfilerActivity, profile

    from raygrid.bench.profile_decode import device_busy_us, device_kernels

    a = torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(a, a)
        time.sleep(0.05)
        torch.mm(a, a)
    spans = [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CPU"]
    first, last = min(lo for lo, _ in spans), max(hi for _, hi in spans)
    busy = device_busy_us(prof, "CPU")
    assert 0 < busy < sum(hi - lo for lo, hi in spans)
    assert busy < (last - first) - 45_000  # the sleep was idle
    assert busy >= max(hi - lo for lo, hi in spans)
    assert device_busy_us(prof) == 0.0  # no CUDA events on this profile
    # The per-kernel table: a launch's own time is what no earlier-started one still covered, so the own times add
    # up to the busy time. Two ranges that overlap as a PDL kernel and the one it waits for do (the second starts
    # inside the first and ends after it): the second owns only its time past the first's end.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        first = torch.ops.profiler._record_function_enter_new("first", None)
        time.sleep(0.01)
        second = torch.ops.profiler._record_function_enter_new("second", None)
        time.sleep(0.01)
        torch.ops.profiler._record_function_exit._RecordFunction(first)
        time.sleep(0.01)
        torch.ops.profiler._record_function_exit._RecordFunction(second)
    spans = {e.name: (e.time_range.start, e.time_range.end) for e in prof.events()}
    table = {k["name"]: k for k in device_kernels(prof, 1, "CPU")}
    assert table.keys() == {"first", "second"} and spans["first"][0] < spans["second"][0] < spans["first"][1] < spans["second"][1]
    assert table["first"]["own_us_per_step"] == table["first"]["us_per_step"]
    assert abs(table["second"]["own_us_per_step"] - (spans["second"][1] - spans["first"][1])) < 1e-3
    assert table["second"]["own_us_per_step"] < table["second"]["us_per_step"] - 5_000  # the 10 ms inside the first
    assert abs(sum(k["own_us_per_step"] for k in table.values()) - device_busy_us(prof, "CPU")) < 1e-3
