"""The prefill attention kernel compiled for an H100/H200 (sm_90a) without a GPU: what ptxas says about it.

    PYTHONPATH=TREE python benchmarks/scripts/wgmma_check.py [--triton-only] [--schedule] [--constexpr NAME=VALUE ...]

For each kernel: registers, spills, shared memory, ptxas's "Potential Performance Loss" notes, and a count of
the SASS opcodes that matter for attention (HGMMA, WARPGROUP arrive/wait, MUFU.EX2, shuffles, shared and local
memory). ptxas keeps Hopper's matrix products (wgmma) asynchronous only when no other instruction writes a
product's inputs, or reads its accumulator, between its issue and a wait for all products in flight; otherwise
it waits after every instruction (note C7513 or C7514), and no softmax overlaps a product. Checking this needs no
GPU: a schedule can be fixed before its device command.

Runs the engine's Triton kernel (``triton_attention._prefill_kernel``, the prompt launch) and, where Triton has
Gluon, ``gluon_attention._prefill_kernel``: as the engine launches it, and once more with each ``--constexpr`` a
candidate diff adds (e.g. ``--constexpr LAZY=1`` for ``results/softmax_probes_h200/dropped_lazy_rescale.diff``).
The kernels of the earlier candidates (``_prefill_kernel_pairs`` of
``results/prefill_gluon_h200/candidate_gluon_pairs_fa3_schedule.diff``, ``_prefill_kernel_ws`` of
``results/ws_preload_h200/candidate_gluon_ws.diff``) are built too when a tree has them.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefill_ttir import prefill_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHOW_SCHEDULE = False
OPCODES = ["HGMMA", "WARPGROUP", "MUFU", "SHFL", "LDS", "STS", "LDSM", "LDL", "STL", "BAR", "SYNCS", "UTMALDG"]


SCHEDULE_OPS = {"scf.for": "loop", "ttng.wait_barrier": "wait for a bulk copy", "ttng.warp_group_dot_wait": "wait for products",
                "ttng.warp_group_dot ": "product", "ttng.async_tma_copy_global_to_local": "bulk copy",
                "ttng.warpgroup_mma ": "product", "ttng.warpgroup_mma_wait": "wait for products"}


def schedule(ttgir: str) -> list[str]:
    """The kernel's order of matrix products, waits and bulk copies, from its TritonGPU IR after pipelining: what
    runs asynchronously and where each product is waited for (``pendings``: how many may stay in flight)."""
    steps = []
    for line in ttgir.splitlines():
        for op, what in SCHEDULE_OPS.items():
            if op in line:
                pendings = re.search(r"pendings = (\d+)", line)
                steps.append(what + (f" (pendings {pendings.group(1)})" if pendings else ""))
    return steps


def report(name: str, compiled) -> None:
    work = tempfile.mkdtemp()
    with open(os.path.join(work, "k.ptx"), "w") as f:
        f.write(compiled.asm["ptx"])
    with open(os.path.join(work, "k.cubin"), "wb") as f:
        f.write(compiled.asm["cubin"])
    from triton.backends.nvidia.compiler import get_ptxas  # the ptxas Triton itself runs for this architecture

    ptxas = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", os.path.join(work, "k.ptx"),
                            "-o", os.path.join(work, "k.o")], capture_output=True, text=True)
    notes = [line.split("info    : ")[-1].strip() for line in (ptxas.stderr + ptxas.stdout).splitlines()
             if "Performance Loss" in line or "Used" in line or "spill" in line] or [f"ptxas: {ptxas.stderr.strip()[:300]}"]
    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", os.path.join(work, "k.cubin")],
                          capture_output=True, text=True).stdout
    ops = collections.Counter(re.findall(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)[.\s]", sass))
    print(f"== {name}: shared {compiled.metadata.shared} B")
    for note in notes:
        print("  ", note)
    print("   SASS:", {op: ops.get(op, 0) for op in OPCODES})
    if SHOW_SCHEDULE:
        print("   schedule:", " | ".join(schedule(compiled.asm["ttgir"])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--triton-only", action="store_true")
    parser.add_argument("--schedule", action="store_true", help="also each kernel's products, waits and bulk copies")
    parser.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                        help="build the Gluon kernel again with this switch of a candidate diff (an int; repeatable)")
    args = parser.parse_args()
    global SHOW_SCHEDULE
    SHOW_SCHEDULE = args.schedule
    from raygrid.kernels import triton_attention

    launch = triton_attention.PREFILL_CONFIG
    constexprs = dict(QUERIES_PER_KV=2, HEAD_DIM=128, BLOCK_D=128, PAGE=64, BLOCK_M=launch["block_m"],
                      BLOCK_N=launch["block_n"], PACK=launch["pack"], DOT_PRECISION="tf32", FP16_COMPUTE=False,
                      TMA=True, WIDE=False, SUBTILES=launch["subtiles"], PDL=True,
                      AHEAD=False)  # a constexpr of the candidate diff's tree only (its Triton variant, off)
    kernel = triton_attention._prefill_kernel
    sig, values = prefill_signature(kernel, constexprs, f"tensordesc<bf16[{launch['block_n']}, 128]>")
    report("triton _prefill_kernel (the prompt launch)",
           triton.compile(ASTSource(kernel, sig, values), target=TARGET,
                          options={"num_warps": launch["num_warps"], "num_stages": launch["num_stages"]}))
    if args.triton_only:
        return
    try:
        from raygrid.kernels import gluon_attention
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError:
        return
    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    # (kernel, warps, extra constexprs, extra options). The warp-specialized kernel of candidate_gluon_ws.diff
    # (benchmarks/results/ws_preload_h200/) comes as its two launches, "ws" (two consumer partitions) and "ws8".
    candidate = {name: int(value) for name, value in (c.split("=", 1) for c in args.constexpr)}
    # An older tree (a candidate diff's whole gluon_attention.py) may lack the engine kernel's STAGES: its own
    # kernels are built alone.
    stages = getattr(gluon_attention, "STAGES", None)
    variants = []
    if stages is not None:
        variants.append(("_prefill_kernel", 4, dict(STAGES=stages), {}))
        if candidate:
            variants.append(("_prefill_kernel", 4, dict(STAGES=stages, **candidate), {}))
    variants += [("_prefill_kernel_pairs", 8, dict(STAGES=3), {}),
                 ("_prefill_kernel_ws", 4, dict(STAGES=4, CONSUMER_REGS=240, PAIRED=False), dict(maxnreg=168)),
                 ("_prefill_kernel_ws", 8, dict(STAGES=4, CONSUMER_REGS=240, PAIRED=True), {})]
    for name, warps, constexprs, options in variants:
        kernel = getattr(gluon_attention, name, None)
        if kernel is None:
            continue
        sig, values = prefill_signature(kernel, dict(QUERIES_PER_KV=2, PAGE=64, **constexprs),
                                        f"tensordesc<bf16[64, 128],{layout}>")
        report(f"gluon {name} {constexprs}", triton.compile(GluonASTSource(kernel, sig, values), target=TARGET,
                                                            options={"num_warps": warps, **options}))


if __name__ == "__main__":
    main()
