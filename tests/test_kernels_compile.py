"""Every Triton kernel through the GPU compiler's front end (Python to Triton IR, for an H100/H200's sm_90), in CI,
where there is no GPU.

The kernel tests run on the CPU under Triton's interpreter, and it accepts what the GPU compiler refuses: a kernel
reading a plain module global (a float constant, 2026-12-02), or a jit helper returning different dtypes on its two
branches (2026-12-01). Each of those was found only on the GPU, at the cost of a device command. Here each kernel's
wrapper runs once on small inputs under the interpreter while its launches are recorded: argument dtypes, constexpr
values, launch options. A process without the interpreter then builds each recorded launch's Triton IR as the GPU
compiler would, and every kernel in ``raygrid.kernels`` must have been built at least once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

triton = pytest.importorskip("triton", reason="Triton is a test dependency; install raygrid[test]")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KERNEL_MODULES = ["triton_allreduce", "triton_attention", "triton_linear", "triton_moe", "triton_ops", "triton_quant",
                  "triton_sampling", "persistent_decode"]


def describe(value):
    from triton import language as tl
    from triton.runtime.jit import mangle_type
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, tl.dtype):  # a constexpr naming the dtype a kernel computes in
        return {"tl_dtype": str(value)}
    if isinstance(value, TensorDescriptor):  # a bulk-copy (TMA) descriptor: its type names dtype and block
        return {"descriptor": mangle_type(value)}
    # Where Triton would assume 16-byte alignment (tensors) or divisibility by 16 (integers), as it specializes launches
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "divisible": value.data_ptr() % 16 == 0}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"value": value, "divisible": value % 16 == 0}
    if isinstance(value, (bool, float, str)) or value is None:
        return {"value": value}
    raise TypeError(f"a kernel argument of type {type(value).__name__}")


def record_launches(monkeypatch, exercise=None, run: bool = True) -> list[dict]:
    """Run each kernel's wrapper once on small CPU inputs under the interpreter (or what ``exercise`` runs),
    recording every launch; with ``run`` false the kernels themselves are not run (launches at real sizes, which
    the interpreter would take minutes over)."""
    from triton.runtime.interpreter import InterpretedFunction

    launches = []
    interpret = InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
        named = dict(zip(self.arg_names, args)) | kwargs
        launches.append({"module": self.fn.__module__, "kernel": self.fn.__name__, "options": options,
                         "args": {name: describe(value) for name, value in named.items()}})
        if run:
            return interpret(self, *args, grid=grid, warmup=warmup, **kwargs, **options)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    (exercise or exercise_every_kernel)()
    return launches


def every_launch(monkeypatch) -> list[dict]:
    """The launches recorded, and the branches a CPU run cannot reach: the kernels that wait for the one before them
    (kernels/pdl.py) do so only on a GPU, and caches past 2**31 elements a half (too large for the CPU suite) take
    64-bit page offsets."""
    launches = record_launches(monkeypatch)
    launches += [dict(launch, args=dict(launch["args"], PDL={"value": True})) for launch in launches if "PDL" in launch["args"]]
    launches += [dict(launch, args=dict(launch["args"], WIDE={"value": True})) for launch in launches
                 if launch["args"].get("WIDE") == {"value": False}]
    # the one-launch pass's timers (inline PTX, GPU only): program 0's, and every program's (benchmarks)
    launches += [dict(launch, args=dict(launch["args"], TIMED={"value": level})) for launch in launches
                 if launch["kernel"] == "_persistent_decode_kernel" and launch["args"]["TIMED"]["value"] == 0
                 for level in (1, 2)]
    return launches


def exercise_every_kernel() -> None:
    from raygrid.kernels import triton_allreduce, triton_attention, triton_linear, triton_moe, triton_ops, triton_quant
    from raygrid.kernels import triton_sampling
    from raygrid.kernels.moe_ref import route_ref
    from raygrid.kernels.sampling_ref import Penalties

    torch.manual_seed(0)
    fp8 = torch.float8_e4m3fn
    heads, kv_heads, dim, page = 4, 2, 16, 4
    lens = torch.tensor([5, 9], dtype=torch.int32)
    tables = torch.tensor([[1, 2, 0], [3, 4, 5]], dtype=torch.int32)
    for cache_dtype in (torch.float32, fp8):  # the model's dtype, and an FP8 KV cache (read as float16 for bf16)
        cache = torch.randn(2, 6, page, kv_heads, dim).to(cache_dtype)
        for dtype in (torch.float32, torch.bfloat16):
            key = torch.randn(3, kv_heads, dim, dtype=dtype)
            triton_attention.store_kv(key, key, cache, torch.tensor([4, -1, 9]))
            query = torch.randn(2, heads, dim, dtype=dtype)
            triton_attention.paged_attention_decode(query, cache, tables, lens, 0.25, block_n=16, num_splits=2,
                                                    min_split_tokens=4, order=torch.tensor([1, 0], dtype=torch.int32))
            starts = torch.tensor([0, 2, 5], dtype=torch.int32)
            triton_attention.paged_attention_prefill(torch.randn(5, heads, dim, dtype=dtype), cache, tables, lens, starts,
                                                     0.25, block_m=16, block_n=16, pack=2)
            whole_pages = torch.randn(2, 3, 16, kv_heads, dim).to(cache_dtype)  # tiles of one page: bulk copies
            for block_m, subtiles in ((16, 1), (32, 2)):  # query tiles whole, and in two halves
                triton_attention.paged_attention_prefill(torch.randn(5, heads, dim, dtype=dtype), whole_pages,
                                                         tables[:, :1] % 3, lens, starts, 0.25, block_m=block_m, block_n=16,
                                                         pack=2, tma=True, subtiles=subtiles)
            triton_attention.paged_attention_prefill(torch.randn(5, heads, dim, dtype=dtype), cache, tables, lens, starts,
                                                     0.25, block_m=32, block_n=16, pack=2, subtiles=2)
            triton_attention.paged_attention_decode(query, whole_pages, tables[:, :1] % 3, lens, 0.25, block_n=16,
                                                    num_splits=2, min_split_tokens=16, tma=True)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(3, 64, dtype=dtype)
        w = torch.randn(64, dtype=dtype)
        triton_ops.rms_norm(x, w, 1e-6, x.clone())
        triton_ops.rms_norm(x, w, 1e-6, x.clone(), fp8_min_scale=1e-12)
        triton_ops.rms_norm(x.view(3, 4, 16), w[:16], 1e-6)
        triton_ops.silu_and_mul(x)
        triton_ops.silu_and_mul(x, fp8_min_scale=1e-12)
        q, k = torch.randn(3, heads, dim, dtype=dtype), torch.randn(3, kv_heads, dim, dtype=dtype)
        positions, cos, sin = torch.tensor([0, 5, 9]), torch.rand(16, dim), torch.rand(16, dim)
        triton_ops.rotary_inplace(positions, q, k, cos, sin)
        triton_ops.qk_norm_rotary(positions, q, k, w[:dim], w[:dim], 1e-6, cos, sin)
        # FP8 products with unit scales, scaled by the kernels that read them (ops.Fp8Product)
        x_scale = torch.rand(3, 1)
        triton_ops.rms_norm(x, w, 1e-6, x.clone(), fp8_min_scale=1e-12, product_scales=(x_scale, torch.rand(64)))
        qkv = torch.randn(3, (heads + 2 * kv_heads) * dim, dtype=dtype)
        q, k, v = (part.view(3, -1, dim) for part in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1))
        scales = (x_scale, torch.rand(qkv.shape[1]))
        triton_ops.rotary_inplace(positions, q, k, cos, sin, v, scales)
        triton_ops.qk_norm_rotary(positions, q, k, w[:dim], w[:dim], 1e-6, cos, sin, v, scales)
        triton_quant.per_token_quant_fp8(x, 1e-12)
        triton_quant.per_token_quant_fp8(torch.randn(1, triton_quant.ONE_PASS_MAX + 8, dtype=dtype), 1e-12)
        triton_quant.scale_fp8_product(x.clone(), torch.rand(3, 1), torch.rand(64), w)
        for split_k in (1, 2):
            triton_linear.skinny_linear(x, torch.randn(24, 64, dtype=dtype), block_n=16, block_k=32, split_k=split_k)
        experts, hidden, inter = 4, 32, 16
        logits = torch.randn(6, experts, dtype=dtype)
        triton_moe.fused_moe(torch.randn(6, hidden, dtype=dtype), torch.randn(experts, 2 * inter, hidden, dtype=dtype),
                             torch.randn(experts, hidden, inter, dtype=dtype), *route_ref(logits, 2, True))
        vocab_logits = torch.randn(3, 300, dtype=dtype)
        seeds = torch.tensor([1, 2, 3])
        penalties = Penalties(torch.rand(4, 300), torch.zeros(4, 300, dtype=torch.bool), torch.tensor([0, 3, 1]),
                              torch.tensor([1.2, 1.0, 1.0]), torch.tensor([0.0, 0.0, 0.5]), torch.tensor([0.1, 0.0, 0.0]))
        for given in (None, penalties):
            triton_sampling.gumbel_argmax(vocab_logits, torch.tensor([0.0, 0.7, 1.0]), seeds, given, block=64, chunk=128)
        triton_sampling.philox_uniform(seeds, 300, block=64)
        triton_sampling.logprob_stats(vocab_logits, seeds, block=64)
        triton_sampling.apply_token_bitmask(vocab_logits, torch.zeros(1, 10, dtype=torch.int32), torch.tensor([1]),
                                            torch.tensor([0]))
        triton_sampling.apply_penalties(vocab_logits.float(), penalties, block=64)
        buffers = torch.zeros(2, dtype=torch.int64)  # peers' buffer addresses: never read, the grid is empty
        for two_shot in (False, True):
            triton_allreduce.launch_all_reduce(two_shot, x.flatten(), x.flatten().clone(), buffers, 1024, 4096, 0, 2, 3,
                                               compile_only=True)
        run_persistent_decode_once(dtype)


def run_persistent_decode_once(dtype: torch.dtype) -> None:
    """A pass of the one-launch decode kernel over a tiny Qwen3 of zeros, for one row and for two (its launches are
    what count here)."""
    from transformers import Qwen3Config

    from raygrid.kernels.persistent_decode import PersistentDecode

    model = qwen3_for_one_launch(Qwen3Config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                             max_position_embeddings=64), dtype)
    for param in model.parameters():
        param.data.zero_()
    caches = [torch.zeros(2, 4, 16, 2, 16, dtype=dtype)]
    for rows in (1, 2):  # one row's launch, and the rows' (the engine takes both)
        decode_step(PersistentDecode(model, caches, splits=2, block_n=16, rows_per_unit=16, heads_per_slice=2,
                                     down_slice=32, rows=rows), rows)
    # Grid barriers after every stage instead of units waiting for their kv heads (benchmarks' option): built too
    decode_step(PersistentDecode(model, caches, splits=2, block_n=16, rows_per_unit=16, heads_per_slice=2,
                                 down_slice=32, head_waits=False), 1)


def qwen3_for_one_launch(config, dtype: torch.dtype):
    """raygrid's Qwen3 of ``config`` in ``dtype``, its rotary tables left in float32 as the loader leaves them."""
    from raygrid.models.qwen3 import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(config).to(dtype)
    for module in model.modules():
        if hasattr(module, "cos_cache"):
            module.float()
    return model


def decode_step(runner, rows: int) -> None:
    """One decode step of ``rows`` requests through a one-launch pass: token 3 at position 3 of each, its key and
    value to slot 19, a context of 4 tokens in a table of two pages."""
    ids = torch.full((rows,), 3)
    runner(ids, ids.clone(), torch.full((rows,), 19), torch.zeros(rows, 2, dtype=torch.int32),
           torch.full((rows,), 4, dtype=torch.int32))


def without_interpreter(command: list[str], stdin: str = "") -> dict:
    """A Python command run from the repository's root in a fresh process without Triton's interpreter (the compiler
    proper: under the interpreter, the kernels' jit helpers are interpreted functions, which the compiler's front end
    cannot call), its JSON output."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, *command], input=stdin, capture_output=True, text=True, env=env, timeout=600,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def build_for_the_gpu(launches: list[dict]) -> dict:
    return without_interpreter(["-m", "tests.kernel_builds", "ir"], json.dumps(launches))


def every_kernel() -> set[str]:
    import importlib

    from triton.runtime.interpreter import InterpretedFunction

    names = set()
    for module in KERNEL_MODULES:
        mod = importlib.import_module(f"raygrid.kernels.{module}")
        names |= {f"{mod.__name__}.{name}" for name, value in vars(mod).items()
                  if isinstance(value, InterpretedFunction) and name.endswith("_kernel") and value.fn.__module__ == mod.__name__}
    return names


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records launches under the interpreter (the CPU suite)")
def test_every_kernel_builds_for_the_gpu(monkeypatch):
    result = build_for_the_gpu(every_launch(monkeypatch))
    assert not result["failures"], "\n".join(result["failures"])
    assert every_kernel() - set(result["built"]) == set(), "kernels no launch here reached: add a call to exercise_every_kernel"


UNSPECIALIZED = textwrap.dedent('''
    import importlib, json, sys
    from triton.runtime.jit import JITFunction
    wrong = []
    for module in sys.argv[1:]:
        for name, kernel in vars(importlib.import_module(f"raygrid.kernels.{module}")).items():
            if isinstance(kernel, JITFunction):
                for option in ("do_not_specialize", "do_not_specialize_on_alignment"):
                    for arg in getattr(kernel, option, []):
                        index = kernel.arg_names.index(arg) if arg in kernel.arg_names else None
                        if index is None or kernel.params[index].is_constexpr:
                            wrong.append(f"{module}.{name}: {option} names {arg!r}, "
                                         + ("a constexpr" if index is not None else "no argument of it"))
    json.dump(wrong, sys.stdout)
''')


def test_every_argument_left_unspecialized_is_one_of_its_kernel():
    """Triton takes ``do_not_specialize`` and ``do_not_specialize_on_alignment`` (kernels/variants.py) as names and
    ignores a name its kernel has no argument of: a kernel argument renamed would quietly compile a variant per
    value or alignment again, in the middle of serving. Read where the kernels are compiled, not interpreted."""
    assert without_interpreter(["-c", UNSPECIALIZED, *KERNEL_MODULES, "gluon_attention"]) == []


GLUON_BUILD = textwrap.dedent('''
    import json, sys
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource
    from raygrid.kernels import gluon_attention
    from tests.kernel_builds import cubin_resources

    kernel = gluon_attention._prefill_kernel
    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    constexprs = dict(QUERIES_PER_KV=2, PAGE=64, STAGES=gluon_attention.STAGES)
    signature = {}
    for param in kernel.params:
        name = param.name
        signature[name] = ("constexpr" if name in constexprs else f"tensordesc<bf16[64, 128],{layout}>" if name.endswith("_desc")
                           else "*bf16" if name == "out_ptr" else "*i32" if name.endswith("_ptr") else "fp32" if name == "scale"
                           else "i32")
    json.dump(cubin_resources(GluonASTSource(kernel, signature, constexprs), GPUTarget("cuda", 90, 32), {"num_warps": 4}),
              sys.stdout)
''')


def test_gluon_prefill_kernel_builds_for_hopper_with_its_products_asynchronous():
    """The Gluon prompt kernel (no interpreter runs it) compiled for sm_90a here, through ptxas: no spills, two programs
    an SM in shared memory, and no "Potential Performance Loss" note. ptxas writes one when it must wait after
    every matrix product because another instruction touches a product's registers while it is in flight. The
    kernel's schedule exists to avoid that, and a change to it can bring the note back without failing any
    result check."""
    from raygrid.kernels import gluon_attention

    if not gluon_attention.available():
        pytest.skip("this Triton has no Gluon Hopper operations")
    result = without_interpreter(["-c", GLUON_BUILD])
    assert result["performance_notes"] == 0, result
    assert result["spill_stores"] == 0, result
    assert 2 * result["shared"] <= 227 * 1024, result


def test_shared_memory_decode_chain_builds_for_hopper():
    """benchmarks/scripts/persistent_decode_chain_smem.py, #21's next design as a feasibility chain (each stage's
    weights streamed into shared memory two stages ahead), compiled for sm_90a here: Gluon does not run in the
    interpreter, so the GPU measures it and this keeps it building. At 4 warps, with each tile asked for at a stage's
    end or after the next stage's vector: no spills, and its two weight slots, vector and barriers in one program's
    shared memory (one program an SM)."""
    from raygrid.kernels import gluon_attention

    if not gluon_attention.available():
        pytest.skip("this Triton has no Gluon Hopper operations")
    built = without_interpreter(["benchmarks/scripts/persistent_decode_chain_smem.py", "--build", "--num-warps", "4",
                                 "--ask", "end", "after_prep"])
    assert set(built) == {"smem_w4", "smem_w4_after_prep"}, built
    for result in built.values():
        assert result["spill_stores"] == 0, result
        assert 192 * 1024 < result["shared"] <= 227 * 1024, result
