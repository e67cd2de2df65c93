"""The prefill attention kernel's Triton IR for an H200 (sm_90), as the engine launches it, with value names
stripped: the operations alone, one a line. Run from two trees and diff the outputs to check that a change which
only moves code (helpers, names) leaves the kernel the GPU runs unchanged. Needs no GPU.

    (cd TREE_A && PYTHONPATH=. python path/to/prefill_ttir.py) > a.txt
    (cd TREE_B && PYTHONPATH=. python path/to/prefill_ttir.py) > b.txt && diff a.txt b.txt
"""

from __future__ import annotations

import re

from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler.compiler import make_backend

from raygrid.kernels import triton_attention

# (subtiles, tiles by bulk copy, rows a tile): prompt tiles in halves and whole, and the 16-row tiles of mixed steps
LAUNCHES = [(2, True, 128), (1, True, 128), (1, False, 16)]


def prefill_signature(kernel, values: dict, descriptor: str | None) -> tuple[dict, dict]:
    """A prefill kernel's signature and constexprs for ``ASTSource``: bf16 queries, outputs and caches, int32 tables
    and lengths; the K/V caches (or a Gluon kernel's ``*_desc`` arguments) as ``descriptor`` where given. A
    constexpr ``values`` leaves out takes its default (a candidate's switch, off)."""
    signature, constexprs = {}, {}
    for param in kernel.params:
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", values.get(param.name, param.default)
        elif descriptor and (param.name in ("k_cache_ptr", "v_cache_ptr") or param.name.endswith("_desc")):
            signature[param.name] = descriptor
        elif param.name.endswith("_ptr"):
            signature[param.name] = "*bf16" if param.name in ("q_ptr", "out_ptr", "k_cache_ptr", "v_cache_ptr") else "*i32"
        else:
            signature[param.name] = "fp32" if param.name == "scale" else "i32"
    return signature, constexprs


def kernel_ops(subtiles: int, tma: bool, block_m: int) -> list[str]:
    kernel = triton_attention._prefill_kernel
    values = dict(QUERIES_PER_KV=2, HEAD_DIM=128, BLOCK_D=128, PAGE=64, BLOCK_M=block_m, BLOCK_N=64, PACK=2,
                  DOT_PRECISION="tf32", FP16_COMPUTE=False, TMA=tma, WIDE=False, SUBTILES=subtiles, PDL=True)
    signature, constexprs = prefill_signature(kernel, values, "tensordesc<bf16[64, 128]>" if tma else None)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({"num_warps": 4, "num_stages": 3})
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    module = ASTSource(kernel, signature, constexprs).make_ir(target, options, backend.get_codegen_implementation(options),
                                                              backend.get_module_map(), context)
    module = backend.make_ttir(module, {}, options, 90)  # inlined, canonicalized
    lines = [re.sub(r"%[\w]+", "%", re.sub(r"loc\(.*?\)", "", line)).strip() for line in str(module).splitlines()
             if not line.startswith("#loc")]
    constants = sorted(line for line in lines if "arith.constant" in line)  # their order is not the kernel's
    return [line for line in lines if "arith.constant" not in line] + constants


if __name__ == "__main__":
    for launch in LAUNCHES:
        print(f"== subtiles, tma, block_m = {launch}")
        print("\n".join(kernel_ops(*launch)))
