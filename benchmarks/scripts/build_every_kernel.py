"""Every Triton kernel of raygrid built for an H100/H200 (sm_90a) with no GPU, under the device's Triton: registers,
spills and shared memory of each distinct launch that the CPU suite's compile test records.

The project's Triton (here) and the device machine's can differ (3.9.0 against 3.6.0 on 2026-12-05), and a kernel
that one compiles the other may refuse, or build with other registers. A device command is scarce; this needs none:

    pip download triton==3.6.0 --no-deps -d /tmp/wheels && pip install --no-deps --target /tmp/triton36 /tmp/wheels/triton-*.whl
    python benchmarks/scripts/build_every_kernel.py OUT.json --triton /tmp/triton36 [--kernel NAME ...] [--vocab 151936]

The launches are recorded under this environment's Triton interpreter (``tests/test_kernels_compile.py``) and built in
a fresh process whose ``sys.path`` starts with ``--triton`` (``tests/kernel_builds.py``). Exits 1 if any launch fails
to build. The shapes are the compile test's tiny ones: register counts depend on the tile constexprs, not the sizes,
but a launch whose tiles the engine picks by size (decode splits, prefill tiles) is built only at the tiles recorded.
``--vocab`` adds the sampling kernels at the tiles the engine uses over a real vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # the recording runs the kernels' wrappers on CPU tensors
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import pytest  # noqa: E402

from tests.test_kernels_compile import every_launch, record_launches  # noqa: E402


def sample_at_vocabulary(vocab: int) -> None:
    """The sampling kernels as the engine launches them (their default tiles) on two bf16 rows of ``vocab`` logits:
    the draw with and without penalties, the logprobs' statistics, the penalties' own pass."""
    import torch

    from raygrid.kernels import triton_sampling
    from raygrid.kernels.sampling_ref import Penalties

    logits, seeds, temperature = torch.randn(2, vocab, dtype=torch.bfloat16), torch.tensor([1, 2]), torch.tensor([0.0, 0.7])
    penalties = Penalties(torch.rand(3, vocab), torch.zeros(3, vocab, dtype=torch.bool), torch.tensor([0, 2]),
                          torch.tensor([1.2, 1.0]), torch.tensor([0.0, 0.5]), torch.tensor([0.1, 0.0]))
    for given in (None, penalties):
        triton_sampling.gumbel_argmax(logits, temperature, seeds, given)
    triton_sampling.logprob_stats(logits, seeds)
    triton_sampling.apply_penalties(logits.float(), penalties)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="JSON: the Triton version, each distinct launch's resources, the failures")
    parser.add_argument("--triton", default=None, help="a folder holding another Triton package (pip --target)")
    parser.add_argument("--kernel", nargs="*", default=None, help="only these kernels (e.g. _gumbel_argmax_kernel)")
    parser.add_argument("--vocab", type=int, default=None, help="also the sampling kernels at the engine's tiles over "
                                                                 "this vocabulary (Qwen3's: 151936)")
    args = parser.parse_args()

    with pytest.MonkeyPatch.context() as patch:
        launches = every_launch(patch)
    if args.vocab:
        with pytest.MonkeyPatch.context() as patch:
            launches += record_launches(patch, lambda: sample_at_vocabulary(args.vocab))
    if args.kernel:
        launches = [launch for launch in launches if launch["kernel"] in args.kernel]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.triton, REPO, env.get("PYTHONPATH")) if p)
    version = subprocess.run([sys.executable, "-c", "import triton; print(triton.__version__, triton.__file__)"],
                             env=env, capture_output=True, text=True, check=True).stdout.split()
    print(f"{len(launches)} launches recorded; building under Triton {version[0]} ({version[1]})", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "tests.kernel_builds", "ptxas"], input=json.dumps(launches), env=env,
                          cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-3000:])
    result = json.loads(done.stdout)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    result.update(triton=version[0], git_commit=commit, date=time.strftime("%Y-%m-%d"), command=" ".join(sys.argv))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for kernel in result["kernels"]:
        tiles = {k: v for k, v in kernel["constexprs"].items() if k.isupper()}
        spills = f", spills {kernel['spill_stores']}/{kernel['spill_loads']} B" if kernel["spill_stores"] else ""
        notes = f", {kernel['performance_notes']} performance notes" if kernel["performance_notes"] else ""
        print(f"{kernel['kernel']} {kernel['options']} {tiles}: {kernel['registers']} registers, "
              f"{kernel['shared']} B shared{spills}{notes}")
    for failure in result["failures"]:
        print("FAILED", failure[:2000])
    print(f"{len(result['kernels'])} distinct launches built, {len(result['failures'])} failed", file=sys.stderr)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
