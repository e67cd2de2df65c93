"""Triton kernels of the FP8 paths, with the reference each matches:

- ``per_token_quant_fp8``: each token (row) of an FP8 layer's input scaled by its own largest value into float8
  e4m3, with its float32 scale (``elementwise_ref.quantize_per_token``, about nine torch kernels and float32
  copies of the activations). It reads a row once (twice above ``ONE_PASS_MAX`` elements) and writes a byte an
  element. The scale is the largest value times 1/448 and values are divided by it rounding to nearest, as the
  reference computes, so the two agree bit for bit.
- ``quantize_row``: the same quantization of one row held in registers, which RMSNorm and SiLU-and-mul
  (``triton_ops``) call to hand an FP8 layer its input already quantized, instead of writing it in the model's
  dtype for this kernel to read again.
- ``scale_fp8_product``: the scaling after a product with unit scales (the small batches' path in ``ops.linear``),
  and ``scale_product_row``, the same scaling of one row as a kernel that reads such a product loads it (RMSNorm and
  rotary, instead of a launch of its own: ``ops.Fp8Product``).
- ``round_to_e4m3``: float32 to the nearest float8 value, for the float8 casts here and in the FP8 KV cache's
  store (``triton_attention``) under the interpreter (``ROUND_BEFORE_FP8_CAST``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)  # float8 e4m3's largest, for kernels to read (a global a kernel reads must be a constexpr)
ONE_PASS_MAX = 16384  # rows up to this many elements stay in registers between the max and the scaling
# Triton's interpreter casts float32 to float8 wrongly where rounding carries into the exponent (125.6 becomes 64);
# under it, kernels round with round_to_e4m3 first, and the cast is then exact. On a GPU the hardware cast rounds to
# nearest even as torch's does (checked on an H200 over every tie between two float8 numbers).
ROUND_BEFORE_FP8_CAST = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def round_to_e4m3(v):
    """float32 values within +-448 rounded to the nearest float8 e4m3 number, ties to even (as torch's cast),
    in integer arithmetic on the float32 bits."""
    bits = v.to(tl.int32, bitcast=True)
    # Normal numbers: keep 3 of the 23 mantissa bits, rounding on the 20 dropped (the sign bit is untouched).
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # -1048576: 0xFFF00000
    # Below 2**-6, float8 numbers are multiples of 2**-9: the mantissa (implicit bit included) shifted by what
    # lies between its exponent and 2**-9, rounded; 25 bits or more shift everything out.
    mantissa = (bits & 0x7FFFFF) | 0x800000
    shift = tl.minimum(tl.maximum(141 - ((bits >> 23) & 0xFF), 1), 25)
    steps = (mantissa + (1 << (shift - 1)) - 1 + ((mantissa >> shift) & 1)) >> shift
    magnitude = (steps.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)
    subnormal = (magnitude | (bits & -2147483648)).to(tl.float32, bitcast=True)  # v's sign bit, so -0 stays -0
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def quantize_row(x, q_ptrs, mask, scale_ptr, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """Store one token's values ``x`` (float32, already rounded to the model's dtype) as float8 at ``q_ptrs`` and
    its scale at ``scale_ptr``, as ``quantize_per_token``. Shared by the kernels that end in an FP8 layer's input."""
    scale = tl.maximum(tl.max(tl.where(mask, tl.abs(x), 0.0), axis=0) * (1.0 / FP8_MAX), MIN_SCALE)
    q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
    if ROUND_FIRST:
        q = round_to_e4m3(q)
    tl.store(q_ptrs, q.to(q_ptrs.dtype.element_ty), mask=mask)
    tl.store(scale_ptr, scale)


@triton.jit
def scale_product_row(y, x_scale_ptr, w_scale_ptr, row, cols, mask, dtype: tl.constexpr):
    """One row of an FP8 layer's product with unit scales (``ops.Fp8Product``) scaled as ``scale_fp8_product``
    scales it (per token, then per channel, in float32), back in the product's dtype: for kernels that read such a
    product and scale it as they load it."""
    y = y.to(tl.float32) * tl.load(x_scale_ptr + row)
    return (y * tl.load(w_scale_ptr + cols, mask=mask, other=0.0)).to(dtype)


@triton.jit
def _per_token_quant_kernel(x_ptr, q_ptr, scale_ptr, K, stride_xm, stride_qm, FP8_MAX: tl.constexpr,
                            MIN_SCALE: tl.constexpr, BLOCK_K: tl.constexpr, ONE_PASS: tl.constexpr,
                            ROUND_FIRST: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    if ONE_PASS:
        ks = tl.arange(0, BLOCK_K)
        x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
        quantize_row(x, q_row + ks, ks < K, scale_ptr + row, FP8_MAX, MIN_SCALE, ROUND_FIRST)
    else:
        amax = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            amax = tl.maximum(amax, tl.abs(tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)))
        scale = tl.maximum(tl.max(amax, axis=0) * (1.0 / FP8_MAX), MIN_SCALE)
        for k in range(0, K, BLOCK_K):
            ks = k + tl.arange(0, BLOCK_K)
            x = tl.load(x_row + ks, mask=ks < K, other=0.0).to(tl.float32)
            q = tl.clamp(tl.math.div_rn(x, scale), -FP8_MAX, FP8_MAX)
            if ROUND_FIRST:
                q = round_to_e4m3(q)
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
                                      MIN_SCALE=min_scale, BLOCK_K=block_k, ONE_PASS=one_pass, ROUND_FIRST=ROUND_BEFORE_FP8_CAST,
                                      num_warps=min(16, max(4, block_k // 1024)))
    return q, scale


@triton.jit
def _scale_product_kernel(y_ptr, x_scale_ptr, w_scale_ptr, b_ptr, M, N, stride_ym, HAS_BIAS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    y = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    y = y * tl.load(x_scale_ptr + rows, mask=rows < M, other=0.0)[:, None]
    y = y * tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    tl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


def scale_fp8_product(y: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """In place: ``y [M, N]`` (an unscaled float8 product) times ``x_scale [M, 1]`` per row and ``w_scale [N]`` per
    column, plus ``bias``. The epilogue of the FP8 layers' small batches (ops.linear)."""
    m, n = y.shape
    block_m = min(16, triton.next_power_of_2(max(m, 1)))
    if m:
        _scale_product_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, 256))](
            y, x_scale, w_scale, bias if bias is not None else w_scale, m, n, y.stride(0), HAS_BIAS=bias is not None,
            BLOCK_M=block_m, BLOCK_N=256, num_warps=4)
    return y
