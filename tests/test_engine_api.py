"""vLLM's offline engine API: EngineArgs (the one definition of the engine's arguments, CLI flags included),
LLMEngine's add_request / step / abort_request loop as vLLM's example scripts use it, and LLM's helpers; the
calls of vLLM's offline examples (llm_engine_example, structured_outputs, chat_with_tools) as tests."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from raygrid import LLM, EngineArgs, LLMEngine, SamplingParams, StructuredOutputsParams
from tests.conftest import random_prompts


@pytest.fixture(scope="module")
def llm(qwen3_dir):
    engine = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=512)  # room for a prompt with tools
    yield engine
    engine.shutdown()


def test_engine_args_make_every_cli_flag():
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", "m", "-tp", "2", "--max-model-len", "128", "--no-enable-prefix-caching",
                              "--enforce-eager", "--dtype", "bfloat16", "--async-scheduling", "--step-timeout-s", "5"])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.model, engine_args.tensor_parallel_size, engine_args.max_model_len, engine_args.enable_prefix_caching,
            engine_args.enforce_eager, engine_args.dtype, engine_args.async_scheduling, engine_args.step_timeout_s) == (
        "m", 2, 128, False, True, "bfloat16", True, 5.0)
    assert EngineArgs.from_cli_args(parser.parse_args([])) == EngineArgs()  # the flags' defaults are the fields'
    assert EngineArgs.from_cli_args(parser.parse_args(["--no-prefix-caching"])).enable_prefix_caching is False
    flags = {action.dest for action in parser._actions}
    assert {f.name for f in dataclasses.fields(EngineArgs)} <= flags
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "int3"])
    with pytest.raises(TypeError, match="max_model_length"):
        EngineArgs(max_model_length=5)


def test_kv_block_size_defaults_by_device(qwen3_dir):
    """Unset, the KV block size resolves by device: 64 on a GPU (pages of whole prefill tiles), 16 on CPU; a
    given size stays."""
    import torch

    from raygrid.config import CPU_BLOCK_SIZE, GPU_BLOCK_SIZE

    def block_size(**kwargs):
        return EngineArgs(model=qwen3_dir, **kwargs).create_engine_config().cache.block_size

    assert (block_size(device="cpu"), block_size(device="cuda")) == (CPU_BLOCK_SIZE, GPU_BLOCK_SIZE) == (16, 64)
    assert block_size(device="cuda", block_size=16) == 16 and block_size(device="cpu", block_size=32) == 32
    assert block_size() == (GPU_BLOCK_SIZE if torch.cuda.is_available() else CPU_BLOCK_SIZE)  # device "auto"


def test_llm_engine_loop_as_vllms_example(qwen3_dir, llm, tokenizer):
    """vLLM's llm_engine_example.py, with only the import changed: add requests, step until done, read the
    finished outputs; they equal LLM.generate's. abort_request ends a request with finish_reason 'abort'."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(3, len(tokenizer), seed=43)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine = LLMEngine.from_engine_args(EngineArgs(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256))
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        engine.add_request("doomed", prompts[0], SamplingParams(max_tokens=200, ignore_eos=True))
        finished, steps = {}, 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
            steps += 1
            if steps == 2:
                engine.abort_request("doomed")
        with pytest.raises(ValueError, match="prompt"):
            engine.add_request("bad", {"prompt_token_ids": []}, params)
    finally:
        engine.shutdown()
    expected = llm.generate(prompts, params, use_tqdm=False)
    assert [finished[str(i)].outputs[0].token_ids for i in range(3)] == [o.outputs[0].token_ids for o in expected]
    assert "doomed" not in finished and steps < 50, "the aborted request (200 tokens) kept the engine stepping"


def test_vllm_offline_helpers(llm, qwen3_dir, tmp_path):
    """get_tokenizer, get_default_sampling_params (generation_config.json's sampling fields, used when generate
    gets no SamplingParams), and chat's rendered prompt and chat_template_kwargs."""
    import json
    import shutil

    assert llm.get_tokenizer() is llm.tokenizer
    assert llm.get_default_sampling_params() == SamplingParams()  # the tiny checkpoint sets no sampling fields
    template = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (out,) = llm.chat([{"role": "user", "content": "hi there"}], SamplingParams(max_tokens=2), use_tqdm=False,
                      chat_template=template, chat_template_kwargs={"greeting": "HELLO "})
    assert out.prompt == "HELLO hi there"
    assert out.prompt_token_ids == llm.get_tokenizer().encode("HELLO hi there", add_special_tokens=False)
    # continue_final_message, as vLLM's: the reply begun in the last message is left open for the model to go on.
    begun = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, the answer is"}]
    (out,) = llm.chat(begun, SamplingParams(max_tokens=2), add_generation_prompt=False, continue_final_message=True, use_tqdm=False)
    assert out.prompt.endswith("<|im_start|>assistant\nSure, the answer is") and len(out.outputs[0].token_ids) == 2
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt cannot both be true"):
        llm.chat(begun, SamplingParams(max_tokens=2), continue_final_message=True, use_tqdm=False)

    copy = tmp_path / "with_defaults"
    shutil.copytree(qwen3_dir, copy)
    generation = json.loads((copy / "generation_config.json").read_text())
    (copy / "generation_config.json").write_text(json.dumps(dict(generation, temperature=0.6, top_k=20, top_p=0.95, do_sample=True)))
    other = LLM(model=str(copy), device="cpu", dtype="float32", max_model_len=128)
    try:
        defaults = other.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.min_p) == (0.6, 20, 0.95, 0.0)
    finally:
        other.shutdown()


# vLLM's structured_outputs example: its simplified SQL grammar (GBNF) and a pydantic model's schema.
SQL_GRAMMAR = """
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
"""


def test_vllm_structured_outputs_and_tools_examples(llm, tokenizer):
    """vLLM's offline structured_outputs.py (choice, regex with a stop string, a pydantic model's JSON schema, a
    grammar) and chat_with_tools.py (tools reach the chat template). The weights are random, so the grammar alone
    makes each output what the example prints; the regex and the model's strings are bounded so that every
    output finishes within its max_tokens."""
    import enum
    import re

    import pydantic

    choice = llm.generate("Classify this sentiment: vLLM is wonderful!",
                          SamplingParams(structured_outputs=StructuredOutputsParams(choice=["Positive", "Negative"])), use_tqdm=False)
    assert choice[0].outputs[0].text in ("Positive", "Negative") and choice[0].outputs[0].finish_reason == "stop"

    email = llm.generate("Generate an email address for Alan Turing, who works in Enigma. End in .com and new line.",
                         SamplingParams(structured_outputs=StructuredOutputsParams(regex=r"[a-z]{1,8}@[a-z]{1,8}\.com\n"),
                                        stop=["\n"], max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r"[a-z]{1,8}@[a-z]{1,8}\.com", email.text) and email.finish_reason == "stop"

    class CarType(str, enum.Enum):
        sedan = "sedan"
        suv = "SUV"
        truck = "Truck"
        coupe = "Coupe"

    class CarDescription(pydantic.BaseModel):
        brand: str = pydantic.Field(max_length=10)
        model: str = pydantic.Field(max_length=10)
        car_type: CarType

    car = llm.generate("Generate a JSON with the brand, model and car_type of the most iconic car from the 90's",
                       SamplingParams(structured_outputs=StructuredOutputsParams(json=CarDescription.model_json_schema()), max_tokens=120),
                       use_tqdm=False)[0].outputs[0]
    assert car.finish_reason == "stop"
    CarDescription.model_validate_json(car.text)

    sql = llm.generate("Generate an SQL query to show the 'username' and 'email' from the 'users' table.",
                       SamplingParams(structured_outputs=StructuredOutputsParams(grammar=SQL_GRAMMAR), max_tokens=60), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r"SELECT col_[12]  from table_[12]  where col_[12] = [12] ", sql.text) and sql.finish_reason == "stop"

    # chat_with_tools.py: the tools go into the template (the Hermes block of Qwen's), and the reply comes back.
    tools = [{"type": "function", "function": {"name": "get_current_weather", "description": "Get the current weather in a given location",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Can you tell me what the temperate will be in Dallas, in fahrenheit?"}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=8), tools=tools, use_tqdm=False)
    assert out.prompt == tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert "get_current_weather" in out.prompt and len(out.outputs[0].token_ids) >= 1


@pytest.mark.parametrize("mode", [dict(), dict(max_num_batched_tokens=32, async_scheduling=True)], ids=["whole", "chunked-async"])
def test_prompt_logprobs_match_transformers(qwen3_dir, tokenizer, mode):
    """SamplingParams(prompt_logprobs=k): the first prompt token has None, each later one its logprob and the
    top k, as transformers' logits give them (float32), whole or in 32-token chunks; a second identical request
    (whose prompt the prefix cache holds) still gets every entry, and logprob k's are checked against the truth."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = random_prompts(1, len(tokenizer), min_len=80, max_len=80, seed=45)[0]
    hf = AutoModelForCausalLM.from_pretrained(qwen3_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        truth = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    llm = LLM(model=qwen3_dir, device="cpu", dtype="float32", max_model_len=256, **mode)
    try:
        params = SamplingParams(max_tokens=2, prompt_logprobs=3, temperature=0)
        first, again = (llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0] for _ in range(2))
    finally:
        llm.shutdown()
    for out in (first, again):
        entries = out.prompt_logprobs
        assert len(entries) == len(prompt) and entries[0] is None
        for position, entry in enumerate(entries[1:]):
            token = prompt[position + 1]
            row = truth[position]
            assert abs(entry[token].logprob - row[token].item()) < 1e-4
            top = row.topk(3)
            assert {t for t, lp in entry.items() if lp.rank <= 3} == set(top.indices.tolist())
            assert entry[token].rank == int((row > row[token]).sum()) + 1
    assert [e for e in first.prompt_logprobs[1:]] == [e for e in again.prompt_logprobs[1:]]


def test_an_engine_keeps_its_startup_objects_out_of_the_collector(qwen3_dir):
    """Startup's objects are frozen and full collections deferred while an engine serves (a full collection then
    skips them: the H200 runs saw 0.3 s pauses without it); shutdown, or dropping the engine, gives them back to
    the collector. Two engines in one process: the collector is restored when the last one goes. In a fresh
    interpreter, where no other test's engine holds the collector."""
    script = f"""
import gc
from raygrid import LLM
from raygrid.engine.gc_tuning import SERVING_FULL_COLLECTION_AFTER
defaults = gc.get_threshold()
make = lambda: LLM(model={qwen3_dir!r}, device="cpu", dtype="float32", max_model_len=128)
engine = make()
assert gc.get_freeze_count() > 10_000 and gc.get_threshold()[2] == SERVING_FULL_COLLECTION_AFTER
engine.shutdown()
assert gc.get_freeze_count() == 0 and gc.get_threshold() == defaults, (gc.get_freeze_count(), gc.get_threshold())
engine, other = make(), make()
other.shutdown()
assert gc.get_freeze_count() > 10_000 and gc.get_threshold()[2] == SERVING_FULL_COLLECTION_AFTER  # the first still serves
del engine
gc.collect()
assert gc.get_freeze_count() == 0 and gc.get_threshold() == defaults, (gc.get_freeze_count(), gc.get_threshold())
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_the_engine_starts_and_generates_on_a_cpu_without_triton(qwen3_dir):
    """Triton is a GPU dependency (the CPU wheel of torch does not bring it; only the test extra installs it here):
    an engine on a CPU must start and generate with no Triton to import, every kernel module it reaches importing
    Triton only where a GPU runs. In a fresh interpreter where ``import triton`` fails. Its KV pool (1 GiB, the CPU's
    default) is zero pages the kernel maps as they are touched, so the start leaves the process's resident memory
    much as it was (torch.zeros wrote the whole pool: 1 GiB more), and shutdown unmaps it."""
    script = f"""
import gc, sys
sys.modules["triton"] = None  # import triton now raises ImportError
from raygrid import LLM, SamplingParams

def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

resident = kib("VmRSS")
engine = LLM(model={qwen3_dir!r}, device="cpu", dtype="float32", max_model_len=128)
assert kib("VmRSS") - resident < 256 * 1024, ("resident KiB after start", kib("VmRSS") - resident)
mapped = kib("VmSize")
out = engine.generate(["Hello there"], SamplingParams(max_tokens=4, temperature=0.8, top_p=0.9, seed=1))
assert len(out[0].outputs[0].token_ids) == 4
engine.shutdown()
gc.collect()
assert mapped - kib("VmSize") > 512 * 1024, ("KiB unmapped at shutdown", mapped - kib("VmSize"))  # 820 MiB seen: threads map more
assert not any(name.startswith("triton.") for name in sys.modules)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_a_hold_whose_collection_finalizes_an_earlier_holder_does_not_deadlock():
    """An engine's hold freezes the engine itself, but not what holds it later: a dropped engine whose last owner is a
    reference cycle made after its hold goes when the next collection frees that cycle, and its finalizer releases
    the collector. When that collection is a new engine's ``hold`` (its ``gc.collect()``, under the lock), the release
    runs on the same thread inside it. A CI run hung there forever (test_hf_parity's next engine). In a fresh
    interpreter, with automatic collection off so that hold's own collection is the one that frees the cycle."""
    script = """
import gc, weakref
from raygrid.engine import gc_tuning
defaults = gc.get_threshold()
class Holder:  # as EngineCore holds: a hold, and a release when it goes
    def __init__(self):
        gc_tuning.hold_serving_collector()
        weakref.finalize(self, gc_tuning.release_serving_collector)
gc.disable()
owner = [Holder()]
owner.append(owner)  # the holder's only owner: a cycle made after the hold froze what existed
del owner
assert gc_tuning._ServingCollector._holders == 1
gc_tuning.hold_serving_collector()
assert gc_tuning._ServingCollector._holders == 1  # the dropped holder released inside the new hold
gc_tuning.release_serving_collector()
assert gc.get_threshold() == defaults and gc.get_freeze_count() == 0
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_memory_profile_pass_gives_every_token_a_position_the_model_has(llm):
    """On a GPU the KV cache is sized after a forward pass of the whole token budget (8192 tokens, one step's
    most). The budget may exceed the checkpoint's positions (2048 here): the pass's positions must stay under
    max_model_len, as every real step's do, or the rotary tables are read past their end. On the GPU that read
    was silent, and faulted only when the allocator's layout put unmapped memory there (after the kernel
    tests, in one process); on the CPU the tables' indexing raises."""
    from raygrid.engine.memory_profile import profile_forward

    engine = llm.llm_engine.engine
    runner = engine.executor.worker.runner
    budget = engine.config.scheduler.max_num_batched_tokens
    rotary = runner.model.layers[0].self_attn.rotary
    assert budget > rotary.cos_cache.shape[0] > engine.config.model.max_model_len
    profile_forward(runner, budget)
