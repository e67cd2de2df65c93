"""The one-launch batch-1 decode pass (kernels/persistent_decode.py) against the model's own layer-by-layer pass on the
same weights and cache: the final hidden state and the key and value it stores. On CPU the kernel runs under Triton's
interpreter (one program doing every unit, float32); on a GPU with one program an SM. The engine's use of it is
checked on the GPU (tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is a test dependency; install raygrid[test]")

from raygrid.kernels.persistent_decode import MAX_ROWS, PERSISTENT_CONFIG, PersistentDecode  # noqa: E402
from raygrid.engine.memory_profile import sequence_metadata  # noqa: E402
from raygrid.models.loader import load_hf_config, load_model  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
PAGE = 16


def model_and_random_caches(path: str, num_blocks: int, seed: int):
    """The checkpoint's model in float32 on the test's device, its norms' weights drawn from [0.5, 1.5) (the tiny
    checkpoints' are ones, which a pass that skipped them would match), a KV cache of ``num_blocks`` random pages a
    layer, and the generator that drew them (the test draws its inputs from it next)."""
    model = load_model(path, load_hf_config(path), torch.float32, DEVICE)
    attn = model.layers[0].self_attn
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.rand(param.shape, generator=generator) + 0.5)
    caches = [torch.randn(2, num_blocks, PAGE, attn.num_kv_heads, attn.head_dim, generator=generator).to(DEVICE)
              for _ in model.layers]
    return model, caches, generator


def prefilled_sequences(model, caches, generator, contexts):
    """Sequences of ``contexts`` tokens, each in 11 shuffled pages of the caches (never the null block 0), their
    prompts' keys and values stored by the model's own pass: the pages (a row a sequence), each sequence's ids (its
    prompt and one token more) and its next token's (positions, metadata)."""
    pages = (torch.randperm(caches[0].shape[1] - 1, generator=generator)[:11 * len(contexts)] + 1).to(torch.int32)
    pages = pages.reshape(len(contexts), 11).to(DEVICE)
    ids = [torch.randint(3, model.config.vocab_size, (c + 1,), generator=generator).to(DEVICE) for c in contexts]
    steps = []
    with torch.inference_mode():
        for seq, context in enumerate(contexts):
            positions, meta = sequence_metadata(pages[seq:seq + 1], 0, context, PAGE)
            model(ids[seq][:context], positions, caches, meta)
            steps.append(sequence_metadata(pages[seq:seq + 1], context, 1, PAGE))
    return pages, ids, steps


def launch_inputs(order, pages, ids, steps) -> list[torch.Tensor]:
    """A launch's inputs for the next tokens of the sequences in ``order`` (``prefilled_sequences``'s)."""
    return [torch.cat(parts) for parts in zip(*[(ids[i][-1:], steps[i][0], steps[i][1].slot_mapping,
                                                 pages[i:i + 1], steps[i][1].seq_lens_tensor) for i in order])]


@pytest.mark.parametrize("name", ["qwen3", "llama"])
def test_one_launch_equals_the_layer_by_layer_pass(name, qwen3_dir, llama_wide_heads_dir):
    """Contexts of 1, 37 and 150 tokens in shuffled pages (keys a step: 16, so 150 takes 10 steps), with the context in
    1 and in 3 slices (any number, not only powers of 2), and products in units of 16 rows (qkv_proj, o_proj) and of 8
    (gate_up_proj, down_proj) over slices of K (one head of o_proj's, 32 of down_proj's): the hidden state and the
    stored key and value agree with the model's pass to float32's rounding; the barrier counters are back at 0 and no
    barrier timed out. Each product's first weight tile read ahead between a barrier's arrival and its wait (all five;
    none): one program does every unit here, so its later units read their tiles in the stage. Units of rows and slices
    of K that are not powers of 2. gate_up_proj's next unit's tiles asked for while the current one's are summed (the
    default) and not (``mlp_ahead=False``). The query's rotated halves joined in registers (the default) and stored and
    read back (``q_in_registers=False``). Attention's and o_proj's units waiting for their kv heads' counters (the
    default), with qkv_proj units of one head's rows and of several heads' (queries, keys and values), and grid barriers
    after every stage instead (``head_waits=False``). And the launch the engine makes, every argument left to
    ``PERSISTENT_CONFIG`` (32 keys a step, 5 attention stages, 4-row gate_up/down units over down_proj's K whole, wider
    than the model's, every product's first tile read ahead, gate_up_proj's tiles a unit ahead, the query in registers,
    units waiting for their kv heads, and on a GPU each attention unit's first cache tile asked into L2 before its
    query is made ready). On a GPU, also two tiles asked
    ahead (``kv_ahead=2``)."""
    num_blocks = 24
    model, caches, generator = model_and_random_caches({"qwen3": qwen3_dir, "llama": llama_wide_heads_dir}[name],
                                                       num_blocks, seed=0)
    checked = 0
    for context in (1, 37, 150):
        ids = torch.randint(3, model.config.vocab_size, (context + 1,), generator=generator).to(DEVICE)
        table = (torch.randperm(num_blocks - 1, generator=generator)[:11] + 1).to(torch.int32)[None, :].to(DEVICE)
        with torch.inference_mode():
            positions, meta = sequence_metadata(table, 0, context, PAGE)
            model(ids[:context], positions, caches, meta)  # the prompt's keys and values
            expected_caches = [c.clone() for c in caches]
            positions, meta = sequence_metadata(table, context, 1, PAGE)
            expected = model(ids[context:], positions, expected_caches, meta)
            # Small units, so that every product has several column blocks and slices of K (down_proj's last one part
            # empty on the Llama, whose intermediate size is 160); then the engine's launch.
            units = dict(block_n=16, rows_per_unit=16, mlp_rows_per_unit=8, heads_per_slice=1, down_slice=32)
            # Units that are not powers of 2, each in a tile of the next one: 12 of gate_up's rows (tiles of 16), 24
            # of down_proj's (tiles of 32; the last of the hidden size's 64 rows holds 16) over K in slices of 48
            # (tiles of 64; the last slice narrower).
            odd = dict(units, mlp_rows_per_unit=12, down_rows_per_unit=24, down_slice=48)
            # The query through global memory, no cache tile asked ahead, and each of gate_up_proj's units' tiles asked
            # for after the last unit's sum (all three on by default, kv_ahead GPU only).
            plain = dict(kv_ahead=0, q_in_registers=False, mlp_ahead=False)
            # gate_up_proj's next unit's tiles asked for first (``mlp_ahead``, the default) and not, with the first
            # unit's read ahead of the barrier's wait (preload 31) or in the stage (preload 0).
            # Attention's and o_proj's units waiting for their own kv heads (``head_waits``, the default) with units
            # of 16 qkv_proj rows (a head's) and of 64 (the engine's at this width: the tiny models' queries of two kv
            # heads in one unit, their keys and values in another); and grid barriers after every stage.
            launches = [dict(splits=1, preload=31, mlp_ahead=False, head_waits=False, **units),
                        dict(splits=3, preload=0, **units), dict(splits=2, preload=31, head_waits=False, **odd),
                        dict(splits=3, **plain, **dict(odd, rows_per_unit=64)), {}]
            if DEVICE.type == "cuda":  # asking L2 for the cache's lines is inline PTX
                launches.append(dict(splits=3, kv_ahead=2, **units))
            for launch in launches:
                ours = [c.clone() for c in caches]
                runner = PersistentDecode(model, ours, **launch)
                hidden = runner(ids[context:], positions, meta.slot_mapping, table, meta.seq_lens_tensor)
                torch.testing.assert_close(hidden, expected, atol=2e-5, rtol=1e-4)
                for mine, theirs in zip(ours, expected_caches):
                    torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-4)
                runner.check()
                assert not runner.counters.any()
                checked += 1
    assert checked == (18 if DEVICE.type == "cuda" else 15)


def test_one_launch_for_a_few_rows_equals_each_rows_own_pass(qwen3_dir):
    """Two and three sequences' tokens in one launch (contexts of 1, 37 and 150 tokens in shuffled pages of one
    cache, in both orders): each row's hidden state equals the model's pass of that sequence alone, and each stores its
    own key and value; with the context in 1 and in 3 slices a (row, kv head), small units, and the engine's launch.
    The launch is given copies of the caches that nothing else names: it holds them. A launch for 2 rows refuses 3
    tokens, and rows past ``MAX_ROWS`` are refused by name."""
    model, caches, generator = model_and_random_caches(qwen3_dir, num_blocks=40, seed=1)
    contexts = (150, 1, 37)
    pages, ids, steps = prefilled_sequences(model, caches, generator, contexts)
    checked = 0
    for order in ([0, 2], [1, 0, 2], [2, 1, 0]):
        expected_caches = [c.clone() for c in caches]
        with torch.inference_mode():
            expected = [model(ids[i][contexts[i]:], steps[i][0], expected_caches, steps[i][1])[0] for i in order]
        step = launch_inputs(order, pages, ids, steps)
        for launch in (dict(splits=1, block_n=16, rows_per_unit=16, mlp_rows_per_unit=8, heads_per_slice=1,
                            down_slice=32),
                       dict(splits=3, preload=0, kv_ahead=0, q_in_registers=False, mlp_ahead=False, head_waits=False),
                       {}):
            # The caches' copies named by nothing but the launch, which holds what its addresses point into.
            runner = PersistentDecode(model, [c.clone() for c in caches], rows=len(order), **launch)
            ours = runner.held[1]
            hidden = runner(*step)
            torch.testing.assert_close(hidden, torch.stack(expected), atol=2e-5, rtol=1e-4)
            for mine, theirs in zip(ours, expected_caches):
                torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-4)
            runner.check()
            assert not runner.counters.any()
            checked += 1
    assert checked == 9
    with pytest.raises(ValueError, match=r"a launch for 2 rows got 3 tokens"):
        PersistentDecode(model, caches, rows=2)(*step)
    with pytest.raises(ValueError, match=rf"rows must be from 1 to {MAX_ROWS}, got {MAX_ROWS + 1}"):
        PersistentDecode(model, caches, rows=MAX_ROWS + 1)


def test_models_it_cannot_run_are_named_with_the_reason(llama_dir, qwen3_moe_dir, qwen3_dir):
    """Heads narrower than a tensor-core product, experts, FP8 weights: each refused with its reason; a model it
    takes is refused nothing. Without a GPU, asking L2 for the cache's lines (``kv_ahead``) is refused by name."""
    def reason(path, **kwargs):
        model = load_model(path, load_hf_config(path), torch.float32, DEVICE, **kwargs)
        attn = model.layers[0].self_attn
        caches = [torch.zeros(2, 4, PAGE, attn.num_kv_heads, attn.head_dim, device=DEVICE) for _ in model.layers]
        return PersistentDecode.unsupported(model, caches)

    assert reason(qwen3_dir) is None
    assert "head_dim must be a power of 2 from 16" in reason(llama_dir)
    assert "no mixture of experts" in reason(qwen3_moe_dir)
    assert "only unquantized linear layers" in reason(qwen3_dir, quantization="fp8")
    if DEVICE.type == "cpu":
        model = load_model(qwen3_dir, load_hf_config(qwen3_dir), torch.float32, DEVICE)
        attn = model.layers[0].self_attn
        caches = [torch.zeros(2, 4, PAGE, attn.num_kv_heads, attn.head_dim) for _ in model.layers]
        with pytest.raises(ValueError, match=r"kv_ahead \(2\) asks a GPU's L2 .*: GPU only"):
            PersistentDecode(model, caches, kv_ahead=2)
        with pytest.raises(ValueError, match=r"block_n must be a power of 2, got 24"):
            PersistentDecode(model, caches, block_n=24)
        # Unset settings take PERSISTENT_CONFIG's, 0 the launch's own: gate_up_proj's units then qkv_proj's size.
        default, own = PersistentDecode(model, caches), PersistentDecode(model, caches, mlp_rows_per_unit=0)
        assert default.gate_up_rows == PERSISTENT_CONFIG["mlp_rows_per_unit"] and own.gate_up_rows == own.bn
        assert default.constexprs["Q_REGS"] is PERSISTENT_CONFIG["q_in_registers"]
        assert default.constexprs["MLP_AHEAD"] is PERSISTENT_CONFIG["mlp_ahead"]
        assert default.constexprs["KV_AHEAD"] == 0  # on the CPU the default asks for no tile


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU's residency limits")
def test_a_grid_the_gpu_cannot_hold_at_once_is_refused(qwen3_dir):
    """Barriers wait for every program, so a grid larger than the GPU holds at once would wait for programs that
    never start: refused with the limit, before any launch. Two programs an SM at 4 warps fit."""
    model = load_model(qwen3_dir, load_hf_config(qwen3_dir), torch.float32, DEVICE)
    attn = model.layers[0].self_attn
    caches = [torch.zeros(2, 4, PAGE, attn.num_kv_heads, attn.head_dim, device=DEVICE) for _ in model.layers]
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    with pytest.raises(ValueError, match=r"num_programs \(\d+\) exceeds the \d+ the GPU holds at once"):
        PersistentDecode(model, caches, num_programs=64 * sms)
    assert PersistentDecode(model, caches, num_programs=2 * sms, num_warps=4).num_programs == 2 * sms
