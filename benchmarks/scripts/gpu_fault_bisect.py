"""Which kernel test leaves the GPU in a state where the next engine faults? (benchmarks/README.md, "The
illegal memory access".) In one process: the kernel tests that ``-k`` selects (each synchronized at its end by
tests/conftest.py), then an engine starts on the same device and generates. Prints one verdict line.

    python benchmarks/scripts/gpu_fault_bisect.py "fp8 or attention"     # kernel tests, then the engine
    python benchmarks/scripts/gpu_fault_bisect.py ""                      # the engine alone
"""

from __future__ import annotations

import os
import sys
import traceback

import pytest
import torch


def engine_generates() -> str:
    from raygrid import LLM, SamplingParams

    # Without torch's caching allocator (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own allocation, so
    # memcheck sees a read past a tensor's end) CUDA graphs cannot be captured: the engine runs eager then.
    eager = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1"
    llm = LLM(model="tiny-random-qwen3", device="cuda", dtype="float32", max_model_len=512, gpu_memory_utilization=0.3,
              enforce_eager=eager)
    try:
        outputs = llm.generate(["Hello, world"] * 4, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                               use_tqdm=False)
        torch.cuda.synchronize()
        return f"engine ok ({sum(len(o.outputs[0].token_ids) for o in outputs)} tokens)"
    finally:
        llm.shutdown()


def main() -> int:
    selection = sys.argv[1]
    if selection:
        code = pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_fp8.py", "tests/test_kernels.py", "-k", selection])
        print(f"kernel tests [{selection}]: exit {int(code)}", flush=True)
    try:
        print(f"VERDICT [{selection}]: {engine_generates()}", flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 - the verdict is the point
        traceback.print_exc()
        print(f"VERDICT [{selection}]: engine FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
