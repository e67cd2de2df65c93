"""GPU path (Triton kernels, CUDA graphs) against transformers and against the CPU path.
Runs on the device machine; on a machine without CUDA these tests are skipped."""

from __future__ import annotations

import gc
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from raygrid import LLM, SamplingParams
from tests.conftest import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run on the device machine")

MAX_NEW = 16


def greedy(logprobs=None):
    return SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=logprobs)


def run(model_dir, prompts, **kwargs):
    llm = LLM(model=model_dir, max_model_len=512, gpu_memory_utilization=0.3, **kwargs)
    try:
        return llm.generate([{"prompt_token_ids": p} for p in prompts], greedy(logprobs=5), use_tqdm=False)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_bf16_tokens_and_logits_match_transformers(model_dirs, tokenizer, model):
    """bf16 tolerance, measured rather than guessed: at every position, raygrid's bf16 logprobs may stray from
    the float32 truth no more than twice as far as transformers' own bf16 logprobs do (plus 0.02). The truth
    is transformers run over the prompt and raygrid's tokens, so the prefill and every decode step (paged
    decode attention, the skinny linear kernel of small batches, CUDA graphs) are compared."""
    prompts = random_prompts(8, len(tokenizer), seed=31)
    outputs = run(model_dirs[model], prompts, device="cuda", dtype="bfloat16")
    hf16 = AutoModelForCausalLM.from_pretrained(model_dirs[model], dtype=torch.bfloat16).cuda().eval()
    hf32 = AutoModelForCausalLM.from_pretrained(model_dirs[model], dtype=torch.float32).cuda().eval()
    ours_err = hf_err = 0.0
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            tokens = out.outputs[0].token_ids
            ids = torch.tensor([prompt + tokens[:-1]], device="cuda")
            at = slice(len(prompt) - 1, None)  # the logits that chose each of raygrid's tokens
            truth = torch.log_softmax(hf32(ids).logits[0, at].float(), dim=-1)
            theirs = torch.log_softmax(hf16(ids).logits[0, at].float(), dim=-1)
            top2 = truth[0].topk(2).values
            if (top2[0] - top2[1]).item() > 0.1:  # a clear winner must be the first token
                assert tokens[0] == int(truth[0].argmax())
            for position, entries in enumerate(out.outputs[0].logprobs):
                for token_id, lp in entries.items():
                    ours_err = max(ours_err, abs(lp.logprob - truth[position, token_id].item()))
                    hf_err = max(hf_err, abs(theirs[position, token_id].item() - truth[position, token_id].item()))
    assert len(out.outputs[0].logprobs) == MAX_NEW
    assert ours_err <= 2 * hf_err + 0.02, f"raygrid bf16 off by {ours_err:.4f}, transformers bf16 by {hf_err:.4f}"


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_gpu_float32_matches_cpu_path(model_dirs, tokenizer, model):
    prompts = random_prompts(8, len(tokenizer), seed=32)
    gpu = run(model_dirs[model], prompts, device="cuda", dtype="float32")
    cpu = run(model_dirs[model], prompts, device="cpu", dtype="float32")
    assert [o.outputs[0].token_ids for o in gpu] == [o.outputs[0].token_ids for o in cpu]


def test_cuda_graphs_match_eager(model_dirs, tokenizer):
    prompts = random_prompts(12, len(tokenizer), seed=33)
    graphs = run(model_dirs["qwen3"], prompts, device="cuda", dtype="bfloat16")
    eager = run(model_dirs["qwen3"], prompts, device="cuda", dtype="bfloat16", enforce_eager=True)
    assert [o.outputs[0].token_ids for o in graphs] == [o.outputs[0].token_ids for o in eager]


def test_seeded_sampling_on_gpu_does_not_depend_on_the_batch(model_dirs, tokenizer):
    """The Triton sampling kernel keys each row's noise by seed and position: a seeded request draws
    the same tokens alone and inside a batch of other sampled, greedy and top-p requests, where its logits are the
    same. They are here: short contexts (one attention slice whatever the batch) and the same layer-by-layer pass at
    both batch sizes (the one-launch pass of a lone request sums in another order)."""
    prompts = [{"prompt_token_ids": p} for p in random_prompts(6, len(tokenizer), seed=34)]
    llm = LLM(model=model_dirs["qwen3"], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="bfloat16",
              persistent_decode=False)
    try:
        for seeded in (SamplingParams(temperature=0.9, seed=5, max_tokens=MAX_NEW, ignore_eos=True),
                       SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=MAX_NEW, ignore_eos=True)):
            alone = llm.generate(prompts[0], seeded, use_tqdm=False)[0].outputs[0].token_ids
            others = [SamplingParams(temperature=1.2, max_tokens=MAX_NEW, ignore_eos=True), greedy(),
                      SamplingParams(temperature=0.7, top_k=20, max_tokens=MAX_NEW, ignore_eos=True)] * 2
            batch = llm.generate(prompts, [seeded] + others[:5], use_tqdm=False)
            assert batch[0].outputs[0].token_ids == alone
            assert len(set(alone)) > 1
    finally:
        llm.shutdown()


@pytest.mark.parametrize("model,quantized", [("qwen3", {}), ("llama", {}), ("qwen3", dict(kv_cache_dtype="fp8")),
                                             ("llama", dict(quantization="fp8"))], ids=["qwen3", "llama", "qwen3-fp8-kv", "llama-fp8"])
def test_async_scheduling_and_graphs_equal_the_plain_engine_for_every_sampling_parameter(model_dirs, tokenizer, model, quantized):
    """The plain engine (synchronous, eager) against async scheduling with CUDA graphs, on the GPU, for the
    sampling features of the CPU test: penalties, min_tokens and stop tokens, top-k/top-p/min-p, seeds,
    logprobs, n; float32, and logprobs compared within a tolerance (the two batchings round differently).
    Also over the FP8 KV cache (its own decode launch) and FP8 weights (torch._scaled_mm, products scaled by the
    kernel after)."""
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=35)]
    results = []
    for mode in (dict(async_scheduling=False, enforce_eager=True), dict(async_scheduling=True)):
        llm = LLM(model=model_dirs[model], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
                  **quantized, **mode)
        try:
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            results.append(summarize(llm.generate(prompts, params_per_prompt(stop), use_tqdm=False)))
            if mode["async_scheduling"]:
                assert llm.engine.step_timing()[0]["max_batches_in_flight"] == 2
                assert llm.engine.executor.worker.runner.graphs is not None
        finally:
            llm.shutdown()
    assert_same_outputs(results[0], results[1])


def test_fp8_products_scaled_by_the_next_kernel_equal_their_own_launch(model_dirs, tokenizer, monkeypatch):
    """FP8 weights in bf16 with CUDA graphs: the small batches' products scaled by the kernel that reads them next
    (RMSNorm, rotary: ops.Fp8Product) against each scaled by a launch of its own (RAYGRID_FP8_DEFER_SCALE=0),
    for every sampling parameter of the CPU test: the same tokens and logprobs, bit for bit, since the kernels
    scale each value as scale_fp8_product does."""
    from raygrid.kernels import ops
    from tests.test_execution_modes import params_per_prompt, summarize

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=41)]
    results = []
    for defer in (False, True):
        monkeypatch.setattr(ops, "FP8_DEFER_SCALE", defer)
        llm = LLM(model=model_dirs["llama"], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="bfloat16",
                  quantization="fp8", async_scheduling=True)
        try:
            qkv_proj = llm.engine.executor.worker.runner.model.layers[0].self_attn.qkv_proj
            x = torch.randn(4, qkv_proj.weight.shape[1], dtype=torch.bfloat16, device="cuda")
            assert isinstance(qkv_proj(x, defer_scale=True), ops.Fp8Product) == defer
            del qkv_proj, x
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            results.append(summarize(llm.generate(prompts, params_per_prompt(stop), use_tqdm=False)))
        finally:
            llm.shutdown()
    assert results[0] == results[1]


@pytest.mark.parametrize("model", ["qwen3", "llama"])
def test_graphs_of_steps_with_prefill_equal_the_plain_engine(model_dirs, tokenizer, model):
    """Under a 64-token budget, prompts of 40 to 150 tokens are prefilled in chunks beside other requests' decodes,
    so most steps replay a mixed full graph (16, 32 or 64 tokens over 256 sequences, padded), and a lone prompt's
    chunks, which take the prompt tiles, the piecewise graphs with eager attention between the pieces. Every
    sampling feature against the plain engine (synchronous, eager), float32."""
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), min_len=40, max_len=150, seed=37)]
    results = []
    for mode in (dict(async_scheduling=False, enforce_eager=True), dict(async_scheduling=True)):
        llm = LLM(model=model_dirs[model], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
                  max_num_batched_tokens=64, **mode)
        try:
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            results.append(summarize(llm.generate(prompts, params_per_prompt(stop), use_tqdm=False)))
            # Plain values only: a runner kept (or held by a failed assertion's traceback) would keep its KV cache
            # from the next engine.
            graphs, piecewise = llm.engine.executor.worker.runner.graphs, llm.engine.executor.worker.runner.piecewise
            used = (graphs and (graphs.mixed_sizes, graphs.num_mixed_replays), piecewise and (piecewise.sizes, piecewise.num_replays))
            del graphs, piecewise
            if mode["async_scheduling"]:
                (mixed_sizes, mixed_replays), (piecewise_sizes, piecewise_replays) = used
                assert mixed_sizes == piecewise_sizes == [16, 32, 64]
                assert mixed_replays >= 10, used  # 19 on an H200
                assert piecewise_replays >= 1, used  # the first prompt's first chunk (64 tokens of one request)
            else:
                assert used == (None, None)
        finally:
            llm.shutdown()
    assert_same_outputs(results[0], results[1])


def test_steps_past_the_mixed_graphs_replay_piecewise_graphs_equal_to_the_plain_engine(model_dirs, tokenizer, monkeypatch):
    """Under a 4,096-token budget, 12 prompts of 200 to 400 tokens, one per sampling feature (3,514 tokens, and the
    request of n=2 twice), fill a first step past the mixed graphs (2,048 tokens at most), so it replays a piecewise
    graph of the sizes every 512 tokens past 2,048, padded by up to 511 rows. Every sampling feature against the
    plain engine (synchronous, eager), float32; a piecewise size past 2,048 must have replayed."""
    from raygrid.engine.piecewise_graphs import PiecewiseGraphs
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    replayed = []
    run_pieces = PiecewiseGraphs.run
    monkeypatch.setattr(PiecewiseGraphs, "run", lambda self, size, *a, **k: replayed.append(size) or run_pieces(self, size, *a, **k))
    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), min_len=200, max_len=400, seed=41)]
    assert sum(len(p["prompt_token_ids"]) for p in prompts) > 2048
    results = []
    for mode in (dict(async_scheduling=False, enforce_eager=True), dict(async_scheduling=True)):
        llm = LLM(model=model_dirs["qwen3"], max_model_len=1024, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
                  max_num_batched_tokens=4096, **mode)
        try:
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            replayed.clear()
            results.append(summarize(llm.generate(prompts, params_per_prompt(stop), use_tqdm=False)))
            runner = llm.engine.executor.worker.runner
            sizes = (runner.piecewise and runner.piecewise.sizes, runner.graphs and runner.graphs.mixed_sizes)
            del runner
            if mode["async_scheduling"]:
                assert sizes[0][-5:] == [2048, 2560, 3072, 3584, 4096] and sizes[1][-1] == 2048, sizes
                assert any(size > 2048 for size in replayed), replayed
            else:
                assert sizes == (None, None) and not replayed
        finally:
            llm.shutdown()
    assert_same_outputs(results[0], results[1])


def test_steps_whose_decode_rows_go_to_the_decode_kernel_equal_one_prompt_launch(model_dirs, tokenizer, monkeypatch):
    """100 short prompts and 16 of 300 to 400 tokens under a 4,096-token budget: the second step, past the mixed
    graphs, holds the first requests' decode rows before the long prompts' chunks, and its attention gives those rows
    to the decode kernel (``paged_attention_split``, at least ``split_decode_rows`` of them). Every sampling feature
    against the same engine with the split off (one prefill launch), float32."""
    from raygrid.kernels import triton_attention
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    short = random_prompts(100, len(tokenizer), min_len=10, max_len=30, seed=43)
    long = random_prompts(16, len(tokenizer), min_len=300, max_len=400, seed=44)
    prompts = [{"prompt_token_ids": p} for p in short + long]
    splits = []
    split = triton_attention.paged_attention_split
    monkeypatch.setattr(triton_attention, "paged_attention_split", lambda *a, **k: splits.append(a[6]) or split(*a, **k))
    llm = LLM(model=model_dirs["qwen3"], max_model_len=1024, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
              max_num_batched_tokens=4096)
    try:
        stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
        features = params_per_prompt(stop)
        params = [features[i % len(features)] for i in range(len(prompts))]
        results = []
        for least in (0, triton_attention.PREFILL_TILE_CHOICE["split_decode_rows"]):
            monkeypatch.setitem(triton_attention.PREFILL_TILE_CHOICE, "split_decode_rows", least)
            assert llm.reset_prefix_cache()
            splits.clear()
            results.append(summarize(llm.generate(prompts, params, use_tqdm=False)))
            assert bool(splits) == bool(least) and all(rows >= 64 for rows in splits), splits
    finally:
        llm.shutdown()
    assert_same_outputs(results[0], results[1])


def test_chunks_of_a_prompt_run_with_their_own_inputs_while_the_gpu_lags(model_dirs, tokenizer):
    """A long prompt's chunks before its last sample nothing, so under async scheduling the engine launches them
    without waiting for the GPU. With the GPU held busy by a spin kernel queued first, the host runs many steps
    ahead; each chunk must still run with its own staged tokens, positions and slots: the same tokens and
    logprobs as the same engine with the GPU idle. (Before the staged inputs' host buffers waited for their
    copies, the lagging run read later chunks' inputs.)"""
    prompt = random_prompts(1, len(tokenizer), min_len=400, max_len=400, seed=37)[0]
    llm = LLM(model=model_dirs["qwen3"], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
              max_num_batched_tokens=32, enable_prefix_caching=False)
    try:
        assert llm.config.scheduler.async_scheduling
        runs = []
        for lag_cycles in (0, 2_000_000_000, 0, 2_000_000_000):
            torch.cuda.synchronize()
            if lag_cycles:
                torch.cuda._sleep(lag_cycles)  # about a second of one busy kernel ahead of the prompt's 13 chunks
            out = llm.generate([{"prompt_token_ids": prompt}], greedy(logprobs=5), use_tqdm=False)[0].outputs[0]
            runs.append((out.token_ids, [{t: lp.logprob for t, lp in step.items()} for step in out.logprobs]))
    finally:
        llm.shutdown()
    tokens, logprobs = runs[0]
    for other_tokens, other_logprobs in runs[1:]:
        assert other_tokens == tokens
        for ours, theirs in zip(logprobs, other_logprobs):
            assert ours.keys() == theirs.keys()
            assert max(abs(ours[t] - theirs[t]) for t in ours) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="Hopper only")
def test_long_prompts_through_the_gluon_kernel_match_the_triton_kernel(tmp_path, tokenizer, monkeypatch):
    """Prompts of 5,000 and 9,000 tokens on 64-token pages, with Qwen3-0.6B's attention shape (head_dim 128, two
    query heads a kv head; two layers). The 8,192-token budget takes the first with part of the second, then the
    rest of the second after its cached prefix (the first, given one token, has finished). Each step brings at
    least 4,096 queries a sequence, so its attention goes to the Gluon prompt kernel (counted). Its prompt logprobs
    are compared with the same engine's on the Triton kernel (PREFILL_CONFIG gluon=False). The two kernels do the
    same arithmetic in the same order, and on an H200 (Triton 3.6) they matched exactly; the bound leaves room for
    bf16 rounding should a compiler reorder one of them."""
    from raygrid.kernels import gluon_attention, triton_attention
    from raygrid.models.default_model import tiny_qwen3_config, write_random_checkpoint

    model_dir = tmp_path / "qwen3_d128"
    write_random_checkpoint(model_dir, tiny_qwen3_config(tokenizer, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                                                         num_key_value_heads=2, head_dim=128, max_position_embeddings=16384),
                            tokenizer, seed=5)
    calls = []
    launch = gluon_attention.paged_attention_prefill
    monkeypatch.setattr(gluon_attention, "paged_attention_prefill", lambda *a, **k: calls.append(1) or launch(*a, **k))
    prompts = [{"prompt_token_ids": random_prompts(1, len(tokenizer), n, n, seed=n)[0]} for n in (5000, 9000)]
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, prompt_logprobs=0)  # no decode rows in step 2
    logprobs = {}
    for gluon in (True, False):
        monkeypatch.setitem(triton_attention.PREFILL_CONFIG, "gluon", gluon)
        calls.clear()
        llm = LLM(model=str(model_dir), max_model_len=10000, gpu_memory_utilization=0.3, dtype="bfloat16", block_size=64,
                  enforce_eager=True, async_scheduling=False)  # step 2 scheduled once the first prompt has finished
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            llm.shutdown()
        # the memory profile's pass (8,192 tokens, one sequence) and both prompt steps, in both layers; none when off
        assert len(calls) == (3 * 2 if gluon else 0), len(calls)
        logprobs[gluon] = torch.tensor([next(iter(e.values())).logprob for o in outputs for e in o.prompt_logprobs[1:]])
    assert logprobs[True].numel() == 5000 + 9000 - 2
    diff = (logprobs[True] - logprobs[False]).abs()
    print(f"prompt logprobs, Gluon against Triton: max {diff.max():.4f}, mean {diff.mean():.5f} over {diff.numel()}")
    assert diff.mean() < 0.01 and diff.max() < 0.25


def test_kv_sizing_counts_sampling_and_graphs(model_dirs):
    """The profiled step includes sampling at max_num_seqs, and the CUDA graphs' memory measured at
    profiling time covers what the real capture then takes."""
    llm = LLM(model=model_dirs["qwen3"], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="bfloat16")
    try:
        report = llm.engine.executor.collective_rpc("memory_report")[0]
        assert report["profiled_cuda_graph_bytes"] > 0
        assert report["cuda_graph_bytes"] <= report["profiled_cuda_graph_bytes"] * 1.1 + 2**20, report
    finally:
        llm.shutdown()


def test_engines_one_after_another_leave_no_device_memory_behind(model_dirs):
    """An engine with CUDA graphs of every kind (decode, mixed, piecewise), started, run and shut down twice: the
    second leaves no more device memory allocated than the first (nothing an engine allocates outlives it; cuBLAS's
    workspace for the capture stream, kept for the process, is allocated by the first)."""
    held = []
    for _ in range(2):
        llm = LLM(model=model_dirs["qwen3"], max_model_len=512, gpu_memory_utilization=0.3, dtype="bfloat16")
        try:
            llm.generate([{"prompt_token_ids": list(range(5, 300))}] * 4, greedy(), use_tqdm=False)
            assert llm.engine.executor.worker.runner.piecewise is not None
        finally:
            llm.shutdown()
        del llm
        gc.collect()
        torch.cuda.synchronize()
        held.append(torch.cuda.memory_allocated())
    assert held[1] <= held[0] + 2**20, f"device memory allocated after each engine: {held}"


def test_the_benchmarks_copy_bandwidth_is_this_gpus_and_keeps_no_memory():
    """`raygrid bench latency`'s memory floor uses the bandwidth of a copy measured on the GPU it runs on (an H200
    copies at about 4.2 TB/s, an H100 at less), and the measurement leaves nothing allocated."""
    from raygrid.bench.memory_floor import copy_bandwidth

    before = torch.cuda.memory_allocated()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    assert 5e11 < bandwidth < 1e13, bandwidth
    assert torch.cuda.memory_allocated() == before
    assert copy_bandwidth(torch.device("cpu")) is None


def test_requests_launch_only_kernel_variants_the_engine_compiled_at_start(qwen3_head128_dir, tokenizer, monkeypatch):
    """Triton compiles a variant of a kernel for each dtype, constexpr and (unless told not to) each integer that
    is 1 or a multiple of 16. On an H200 one takes 0.4 to 2 s, which a user's requests would wait for if a step
    launched a variant that the engine's start (memory profile, graph captures) had not. Requests here bring
    prefill steps of one and of several sequences, past the graphs' sizes and within them, decode steps, mixed
    steps, and sampling by temperature alone, with top-p, greedy and with logprobs, then every sampling feature of
    the execution-mode tests (``params_per_prompt``), a grammar's among them. Heads of 128, as the real models': the
    memory profile's pass of the whole budget then takes the Gluon kernel of long prompts, and the Triton kernel's
    launches of shorter prompts must be compiled by other passes. Last, a step past the graphs' sizes whose leading
    decode rows go to the decode kernel (``paged_attention_split``), the other sequences' inputs read from row 45 on:
    on an H100, W1's first such step compiled the prefill kernel for inputs off 16-byte alignment and the decode
    kernel for rows started in batch order, 2 s while its requests waited."""
    import importlib

    from triton import knobs
    from triton.runtime.jit import JITFunction

    from raygrid.kernels import triton_attention
    from tests.test_execution_modes import params_per_prompt

    kernels = [obj for name in ("triton_attention", "gluon_attention", "triton_ops", "triton_linear", "triton_sampling", "persistent_decode")
               for obj in vars(importlib.import_module(f"raygrid.kernels.{name}")).values() if isinstance(obj, JITFunction)]
    for kernel in kernels:  # what earlier tests in this process compiled counts for nothing (the disk cache stays)
        kernel.device_caches.clear()
    # 48 running at most: the later requests' prompts join steps of the others' decodes (mixed steps), and every mixed
    # graph (2,048 tokens at most over 48 sequences) takes the short query tiles, as with the default 256, so the
    # prompts' launch is captured in none of them.
    llm = LLM(model=qwen3_head128_dir, max_model_len=2048, max_num_seqs=48, gpu_memory_utilization=0.3, dtype="bfloat16",
              persistent_decode=True)  # the lone first request's decode passes take it
    compiled = []
    knobs.runtime.jit_cache_hook = lambda *, fn, key, **_: compiled.append(f"{fn.name} {key}")
    try:
        prompts = [[(7 * i + j) % (len(tokenizer) - 3) + 3 for j in range(n)] for i, n in enumerate((1900, 1200, 1000, 150, 40, 20))]
        plain = SamplingParams(temperature=0.8, max_tokens=MAX_NEW, ignore_eos=True)
        top_p = SamplingParams(temperature=0.8, top_p=0.9, logprobs=2, max_tokens=MAX_NEW, ignore_eos=True)
        llm.generate({"prompt_token_ids": prompts[0]}, plain, use_tqdm=False)  # one sequence
        # three in one step of 2,350 tokens, past the graphs' sizes (2,048 at most)
        llm.generate([{"prompt_token_ids": p} for p in prompts[1:4]], [plain, greedy(), top_p], use_tqdm=False)
        later = [SamplingParams(temperature=0.8, max_tokens=4 + i % 9, ignore_eos=True) for i in range(72)]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts[3:]] * 24, later, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in later]
        # every sampling feature of the execution-mode tests, alone and together: penalties, min_tokens, stop tokens,
        # top-k/top-p/min-p, seeds, logprobs and prompt logprobs, n, logit bias, bad words, allowed tokens, a grammar
        features = params_per_prompt(stop_token=5)
        outputs = llm.generate([{"prompt_token_ids": prompts[4]}] * len(features), features, use_tqdm=False)
        assert all(o.outputs[0].token_ids for o in outputs)
        # 48 running; three stop after two tokens, and three new prompts of 2,350 tokens (none cached) join the other
        # 45's decodes in one step. Those rows go to the decode kernel from 8 on here (64 by default, which a step of
        # 48 never reaches); 45 rows split their contexts as the 48-row graph does (9 slices on 132 SMs).
        monkeypatch.setitem(triton_attention.PREFILL_TILE_CHOICE, "split_decode_rows", 8)
        splits = []
        split = triton_attention.paged_attention_split
        monkeypatch.setattr(triton_attention, "paged_attention_split",
                            lambda *args, **kwargs: splits.append(args[6]) or split(*args, **kwargs))
        fresh = [[(11 * i + 5 * j) % (len(tokenizer) - 3) + 3 for j in range(n)] for i, n in enumerate((1200, 1000, 150))]
        running = [SamplingParams(temperature=0.8, max_tokens=2 if i < 3 else 8, ignore_eos=True) for i in range(48)]
        outputs = llm.generate([{"prompt_token_ids": prompts[5]}] * 48 + [{"prompt_token_ids": p} for p in fresh],
                               running + [plain] * 3, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in running + [plain] * 3]
        assert 45 in splits, splits
    finally:
        knobs.runtime.jit_cache_hook = None
        llm.shutdown()
    assert not compiled, f"{len(compiled)} variants compiled while serving: {compiled}"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpu_layouts_equal_one_gpu_for_every_sampling_parameter(model_dirs, tokenizer):
    """TP=2 with its GPU defaults (CUDA graphs holding the all-reduces, async scheduling, the compiled
    graph), TP=2 eager and synchronous, PP=2 with graphs, and TP=2 with the custom all-reduce give what one GPU gives, eager and synchronous,
    for every sampling feature; float32, so that the layouts' different sum orders stay far below the
    tokens' margins. Each worker sees both GPUs and reaches the other as a peer (what NCCL's NVLink path needs)."""
    from tests.test_distributed import outputs_agree
    from tests.test_execution_modes import params_per_prompt

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=36)]
    common = dict(model=model_dirs["qwen3"], max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32")
    plain = LLM(**common, enforce_eager=True, async_scheduling=False)
    try:
        params = params_per_prompt(plain.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2])
        expected = plain.generate(prompts, params, use_tqdm=False)
    finally:
        plain.shutdown()
    for mode in (dict(tensor_parallel_size=2), dict(tensor_parallel_size=2, enforce_eager=True, async_scheduling=False),
                 dict(pipeline_parallel_size=2), dict(tensor_parallel_size=2, custom_all_reduce=True)):
        llm = LLM(**common, **mode)
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            devices = llm.engine.collective_rpc("device_report")[0]
            timing = llm.engine.step_timing()[0]
        finally:
            llm.shutdown()
        assert all(o.error is None for o in outputs), mode
        outputs_agree(outputs, expected, logprob_tol=1e-3)
        assert sorted(d["device"] for d in devices) == ["cuda:0", "cuda:1"], devices
        assert all(d["visible_devices"] == 2 and len(d["peer_access"]) == 1 for d in devices), devices
        assert timing["max_batches_in_flight"] == (1 if mode.get("async_scheduling") is False else 2), (mode, timing)
        if mode.get("custom_all_reduce"):  # its kernels, inside the CUDA graphs, with NVLink checked through NVML
            assert all(d["custom_all_reduce"] == {"enabled": True, "reason": ""} for d in devices), devices


def test_expert_parallel_world_of_one_gpu_equals_the_plain_engine(qwen3_moe_dir, tokenizer):
    """The expert-parallel path on one GPU (an EP group of one rank, 2 redundant slots, EPLB every 4 steps, decode
    graphs captured under the DP context, async scheduling) gives what the plain engine gives, for every sampling
    feature; float32."""
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=38)]
    results = []
    eplb = dict(enable_expert_parallel=True, enable_eplb=True, eplb_config=dict(num_redundant_experts=2, step_interval=4, window_size=8))
    for mode in (dict(async_scheduling=False, enforce_eager=True), dict(async_scheduling=True, **eplb)):
        llm = LLM(model=qwen3_moe_dir, max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32", **mode)
        try:
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            results.append(summarize(llm.generate(prompts, params_per_prompt(stop), use_tqdm=False)))
            if "enable_eplb" in mode:
                assert llm.engine.executor.worker.runner.graphs is not None
                assert llm.get_stats().eplb_rebalances >= 5
        finally:
            llm.shutdown()
    assert_same_outputs(results[0], results[1])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_expert_parallel_on_two_gpus_equals_one_gpu_for_every_sampling_parameter(qwen3_moe_dir, tokenizer):
    """EP=2 (DP=2 attention) with its GPU defaults (decode CUDA graphs holding the MoE all-gather and
    reduce-scatter, async scheduling, the compiled graph) and EPLB rebalancing every 4 steps, and EP=2 eager,
    give what one GPU gives (eager, synchronous) for every sampling feature, float32; and a prompt alone (the
    other DP rank idle) gives its tokens too."""
    from tests.test_distributed import outputs_agree
    from tests.test_execution_modes import params_per_prompt

    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=37)]
    common = dict(model=qwen3_moe_dir, max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32")
    plain = LLM(**common, enforce_eager=True, async_scheduling=False)
    try:
        params = params_per_prompt(plain.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2])
        expected = plain.generate(prompts, params, use_tqdm=False)
        alone = plain.generate(prompts[7], greedy(), use_tqdm=False)
    finally:
        plain.shutdown()
    eplb = dict(enable_eplb=True, eplb_config=dict(num_redundant_experts=2, step_interval=4, window_size=8))
    for mode in (dict(**eplb), dict(enforce_eager=True, async_scheduling=False)):
        llm = LLM(**common, enable_expert_parallel=True, data_parallel_size=2, **mode)
        try:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            alone_ep = llm.generate(prompts[7], greedy(), use_tqdm=False)
            stats = llm.get_stats()
        finally:
            llm.shutdown()
        assert all(o.error is None for o in outputs), mode
        outputs_agree(outputs, expected, logprob_tol=1e-3)
        assert alone_ep[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
        assert stats.eplb_rebalances >= (5 if "enable_eplb" in mode else 0), mode


def persistent_passes(llm, expected: bool) -> Counter:
    """How many passes the engine's runner took in one persistent launch, by the launch's rows; checks that it has a
    launch for 1 to ``max_rows`` requests if ``expected``, each replayed from a CUDA graph, and that no barrier of them
    timed out. (A function, so that no name holds the runner, and with it the KV pool, once the engine is shut
    down.)"""
    from raygrid.kernels.persistent_decode import PERSISTENT_CONFIG

    runner = llm.engine.executor.worker.runner
    rows = list(range(1, PERSISTENT_CONFIG["max_rows"] + 1)) if expected else []
    assert sorted(runner.persistent) == rows and sorted(runner.persistent_graphs) == rows
    for launch in runner.persistent.values():
        launch.check()
    return runner.persistent_passes


@pytest.mark.parametrize("model", ["qwen3", "llama_wide_heads"])
def test_persistent_decode_equals_the_layer_by_layer_engine_for_every_sampling_parameter(model_dirs, llama_wide_heads_dir,
                                                                                        tokenizer, model):
    """The decode passes of a few requests in one persistent launch (``persistent_decode=True``) against the engine
    without it (CUDA graphs of the layer-by-layer pass): each prompt alone, so that its decode steps take the one-row
    launch, then all twelve at once, ending a step apart, whose last steps (``max_rows`` requests or fewer left) take
    the launches of several rows:
    the same tokens and logprobs within float32's rounding for every sampling feature, each launch taken, and no
    barrier of them timed out."""
    from raygrid.kernels.persistent_decode import PERSISTENT_CONFIG
    from tests.test_execution_modes import assert_same_outputs, params_per_prompt, summarize

    path = llama_wide_heads_dir if model == "llama_wide_heads" else model_dirs[model]
    prompts = [{"prompt_token_ids": p} for p in random_prompts(12, len(tokenizer), seed=37)]
    results, passes = [], []
    for persistent in (False, True):
        llm = LLM(model=path, max_model_len=512, gpu_memory_utilization=0.3, device="cuda", dtype="float32",
                  persistent_decode=persistent)
        try:
            stop = llm.generate(prompts[3], greedy(), use_tqdm=False)[0].outputs[0].token_ids[2]
            outputs = [llm.generate([p], params, use_tqdm=False)[0] for p, params in zip(prompts, params_per_prompt(stop))]
            # Each request a token longer than the one before, so the batch shrinks a request a step at its end.
            staggered = [p.model_copy(update={"max_tokens": 8 + i}) for i, p in enumerate(params_per_prompt(stop))]
            together = llm.generate(prompts, staggered, use_tqdm=False)
            results.append((summarize(outputs), summarize(together)))
            passes.append(persistent_passes(llm, persistent))
        finally:
            llm.shutdown()
    assert_same_outputs(results[0][0], results[1][0])  # the outputs first: a failure below would hide theirs
    assert_same_outputs(results[0][1], results[1][1])
    assert not passes[0] and passes[1][1] >= 100, passes  # 12 requests of up to 20 tokens, one with n=2
    assert all(passes[1][rows] > 0 for rows in range(2, PERSISTENT_CONFIG["max_rows"] + 1)), passes
