"""A Triton kernel for the FP8 layers' inputs: each token (row) scaled by its own largest value into float8
e4m3, with its float32 scale, in one kernel. The reference is ``models/layers/fp8.quantize_per_token``, which
takes about nine torch kernels and float32 copies of the activations; this one reads the row once (twice for
rows of more than ``ONE_PASS_MAX`` elements) and writes one byte an element. Divisions round to nearest, as
torch's do, so the two agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ONE_PASS_MAX = 16384  # rows up to this many elements stay in registers between the max and the scaling


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, scale_ptr, K, stride_xm, stride_qm, FP8_MAX: tl.constexpr,
                            MIN_SCALE: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    if ONE_PASS:
        ks = tl.arange(0, BLOCK_K)
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), FP8_MAX), MIN_SCALE)
        q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
        tl.store(q_row + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    else:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)))
        scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), FP8_MAX), MIN_SCALE)
        for k in range(0, K, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
            q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
            tl.store(q_row + ks, q.to(q_ptr.dtype.element_ty), mask=ks < K)
    tl.store(scale_ptr + row, scale)


def per_token_quant_fp8(x: torch.Tensor, min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` -> (float8 e4m3 ``[M, K]``, float32 scale ``[M, 1]``), as ``quantize_per_token``."""
    m, k = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    one_pass = k <= ONE_PASS_MAX
    block_k = triton.next_power_of_2(k) if one_pass else 4096
    if m:
        _per_token_quant_kernel[(m,)](x, q, scale, k, x.stride(0), q.stride(0), FP8_MAX=torch.finfo(torch.float8_e4m3fn).max,
                                      MIN_SCALE=min_scale, BLOCK_K=block_k, ONE_PASS=one_pass,
                                      num_warps=min(16, max(4, block_k // 1024)))
    return q, scale
