"""One launch each of the prompt attention kernels on 1 x 8,192 tokens (Qwen3-0.6B's heads, bf16, 64-token pages in
random order): raygrid's Triton kernel, its Gluon kernel (where the GPU and Triton have it) and PyTorch's SDPA,
inside an NVTX range "measured", for Nsight Compute. benchmarks/README.md ("Prefill attention with its copies
asked for a step ahead") reads such a report.

    ncu --clock-control none --nvtx --nvtx-include "measured/" --launch-count 4 \\
        --section WarpStateStats --section SourceCounters ... -o OUT python3 benchmarks/scripts/ncu_prefill_case.py
    ncu --import OUT.ncu-rep --page source --print-source sass --csv -k regex:_prefill_kernel > sass.csv
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sweep_prefill_attention import HEAD_DIM, make_case  # noqa: E402

from raygrid.kernels.triton_attention import paged_attention_prefill  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    (q, k, v), (packed, cache, tables, lens, starts) = make_case(1, 8192, 0, "random", 64)
    scale = HEAD_DIM**-0.5
    launches = [lambda: paged_attention_prefill(packed, cache, tables, lens, starts, scale, gluon=False),
                lambda: paged_attention_prefill(packed, cache, tables, lens, starts, scale, gluon=True),
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)]
    for _ in range(3):  # compiled and warm before the measured range
        for launch in launches:
            launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("measured")
    for launch in launches:
        launch()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
