"""Recorded launches of raygrid's Triton kernels built for an H100/H200 (sm_90), in a process without Triton's
interpreter. Two depths:

- ``ir``: the compiler's front end, Python to Triton IR (what CI checks for every kernel, tests/test_kernels_compile.py);
- ``ptxas``: the whole way to a cubin, then ``ptxas -v`` on its PTX: registers, spills and shared memory of each
  distinct launch. ``benchmarks/scripts/build_every_kernel.py`` runs it under another Triton (the device's).

    python -m tests.kernel_builds ir|ptxas < launches.json > result.json

The launches (JSON, as ``test_kernels_compile.record_launches`` writes them) come on stdin; the result goes to
stdout: ``failures`` (one line each), ``built`` (module.kernel names) and, for ``ptxas``, ``kernels``.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile

TYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8e4nv", "int32": "i32",
         "int64": "i64", "uint8": "u8", "int8": "i8", "bool": "i1"}


def signature_of(kernel, args: dict) -> tuple[dict, dict, dict]:
    """``ASTSource``'s signature, constexprs and attributes for one recorded launch of ``kernel``: a pointer or
    integer Triton would specialize as divisible by 16 at that launch gets ``tt.divisibility`` (vectorized loads, and
    on Hopper the wgmma products, depend on it)."""
    from triton import language as tl

    signature, constexprs, attrs = {}, {}, {}
    for index, param in enumerate(kernel.params):
        arg = args.get(param.name, {"value": param.default})
        if "tl_dtype" in arg:
            signature[param.name], constexprs[param.name] = "constexpr", tl.dtype(arg["tl_dtype"])
        elif param.is_constexpr or arg.get("value", 0) is None or isinstance(arg.get("value"), str):
            signature[param.name], constexprs[param.name] = "constexpr", arg.get("value")
        elif "tensor" in arg:
            signature[param.name] = "*" + TYPES[arg["tensor"]]
        elif "descriptor" in arg:
            signature[param.name] = arg["descriptor"]
        elif isinstance(arg["value"], bool):
            signature[param.name] = "i1"
        elif isinstance(arg["value"], int):
            signature[param.name] = "i32" if -2**31 <= arg["value"] < 2**31 else "i64"
        else:
            signature[param.name] = "fp32"
        if (arg.get("divisible") and signature[param.name] != "constexpr" and not param.do_not_specialize
                and not param.do_not_specialize_on_alignment):
            attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def front_end(source, target, options: dict) -> None:
    """Python to Triton IR, as the GPU compiler's first stage does it (raises where that refuses the kernel)."""
    from triton._C.libtriton import ir
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    parsed = backend.parse_options(options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source.make_ir(target, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(), context)


def cubin_resources(source, target, options: dict) -> dict:
    """Compiled to PTX by this Triton (``source`` an ``ASTSource`` or Gluon's), then through its ptxas with ``-v``:
    what one program of the kernel holds, and how many "Potential Performance Loss" notes ptxas wrote (one where it
    must wait after each Hopper matrix product)."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas

    compiled = triton.compile(source, target=target, options=options)
    with tempfile.TemporaryDirectory() as work:
        ptx = os.path.join(work, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        done = subprocess.run([get_ptxas(target.arch).path, "-v", "--gpu-name", f"sm_{target.arch}a", ptx, "-o",
                               os.path.join(work, "k.o")], capture_output=True, text=True)
    report = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(report[-2000:])

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        if found is None:  # ptxas -v names every one of these for each kernel
            raise RuntimeError(f"ptxas -v printed no {pattern!r}: {report[-2000:]}")
        return int(found.group(1))

    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "shared": compiled.metadata.shared,
            "performance_notes": report.count("Potential Performance Loss")}


def main(mode: str) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    failures, built, kernels, seen = [], set(), [], set()
    for launch in json.load(sys.stdin):
        kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        signature, constexprs, attrs = signature_of(kernel, launch["args"])
        key = json.dumps([launch["module"], launch["kernel"], signature, launch["options"],
                          {name: str(value) for name, value in constexprs.items()}, sorted(attrs)], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        source = ASTSource(kernel, signature, constexprs, attrs)
        try:
            if mode == "ir":
                front_end(source, target, launch["options"])
            else:
                kernels.append({"kernel": launch["kernel"], "options": launch["options"],
                                "constexprs": {name: str(value) for name, value in constexprs.items()},
                                **cubin_resources(source, target, launch["options"])})
            built.add(launch["module"] + "." + launch["kernel"])
        except Exception as error:
            cause = f" (from {type(error.__cause__).__name__}: {error.__cause__})" if error.__cause__ else ""
            failures.append(f"{launch['kernel']} {signature} {constexprs}: {type(error).__name__}: {error}{cause}")
    return {"failures": failures, "built": sorted(built), "kernels": kernels}


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("ir", "ptxas"):
        sys.exit("usage: python -m tests.kernel_builds ir|ptxas < launches.json")
    json.dump(main(sys.argv[1]), sys.stdout)
