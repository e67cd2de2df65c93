"""Gluon prefill kernel, head_groups 1 and 8, on 1x8192@24576 and 1x32768, inside NVTX "measured" for ncu."""
import os, sys
import torch
sys.path.insert(0, "benchmarks/scripts")
from sweep_prefill_attention import HEAD_DIM, make_case
from raygrid.kernels.triton_attention import paged_attention_prefill
torch.manual_seed(0)
launches = []
for seqs, total, prefix in [(1, 32768, 24576), (1, 32768, 0)]:
    _, (packed, cache, tables, lens, starts) = make_case(seqs, total, prefix, "random", 64)
    for g in (1, 8):
        launches.append(lambda packed=packed, cache=cache, tables=tables, lens=lens, starts=starts, g=g:
                        paged_attention_prefill(packed, cache, tables, lens, starts, HEAD_DIM**-0.5, head_groups=g))
for _ in range(2):
    for f in launches:
        f()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("measured")
for f in launches:
    f()
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
print("ok")
