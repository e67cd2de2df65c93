"""Triton kernels of the elementwise hot paths: RMSNorm with fused residual add, rotary embedding,
Qwen3's q/k norms fused with rotary, SiLU-and-mul. Their definitions are the references in ``elementwise_ref.py``.
RMSNorm and SiLU-and-mul can also end in the per-token FP8 quantization of the layer they feed
(``triton_quant.quantize_row``): ``fp8=True`` returns the float8 values and their scales."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from raygrid.kernels.pdl import pdl_launch, pdl_wait
from raygrid.kernels.triton_quant import (FP8_MAX, ONE_PASS_MAX, ROUND_BEFORE_FP8_CAST, per_token_quant_fp8, quantize_row,
                                          scale_product_row)


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, scale_ptr, x_scale_ptr, w_scale_ptr, stride_x0, stride_x1,
                     stride_r, stride_o, n_cols, rows_per_group, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
                     FP8_OUT: tl.constexpr, SCALED_IN: tl.constexpr, MIN_SCALE: tl.constexpr, ROUND_FIRST: tl.constexpr,
                     PDL: tl.constexpr):
    pdl_wait(PDL)
    row = tl.program_id(0)
    # Rows are (group, index) pairs so that per-head norms can read q/k straight out of the qkv output.
    x_offset = (row // rows_per_group) * stride_x0 + (row % rows_per_group) * stride_x1
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + x_offset + cols, mask=mask, other=0.0)
    if SCALED_IN:  # x is an FP8 layer's product still to be scaled
        x = scale_product_row(x, x_scale_ptr, w_scale_ptr, row, cols, mask, x_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        x = (x + tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_r + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, axis=0) / n_cols
    y = (x32 * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    y = (w * y).to(x_ptr.dtype.element_ty)  # the model's dtype, as the reference rounds it
    if FP8_OUT:
        quantize_row(y.to(tl.float32), out_ptr + row * stride_o + cols, mask, scale_ptr + row, FP8_MAX, MIN_SCALE, ROUND_FIRST)
    else:
        tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             fp8_min_scale: float | None = None, product_scales: tuple[torch.Tensor, torch.Tensor] | None = None):
    """``x`` is ``[T, d]`` or ``[T, heads, d]`` (rows may be strided); returns like the reference:
    ``norm(x)`` or ``(norm(x + residual), x + residual)``. With ``fp8_min_scale`` (``[T, d]`` only) the norm comes
    quantized per token: ``(float8 values, float32 scales [T, 1])`` in its place. With ``product_scales``
    (``x_scale [T, 1]``, ``weight_scale [d]``; ``[T, d]`` only), ``x`` is an FP8 layer's product with unit scales,
    scaled here as ``scale_fp8_product`` would scale it first."""
    n = x.shape[-1]
    if x.dim() == 3:
        rows, per_group, s0, s1 = x.shape[0] * x.shape[1], x.shape[1], x.stride(0), x.stride(1)
    else:
        rows, per_group, s0, s1 = x.shape[0], 1, x.stride(0), 0
    fp8 = fp8_min_scale is not None
    if (fp8 or product_scales is not None) and x.dim() != 2:
        raise ValueError("rms_norm: an FP8 output or input needs [T, d] rows")
    out = torch.empty(x.shape, dtype=torch.float8_e4m3fn if fp8 else x.dtype, device=x.device)
    scale = torch.empty(rows, 1, dtype=torch.float32, device=x.device) if fp8 else out
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else out
    res_in = residual.contiguous() if residual is not None else out
    x_scale, w_scale = product_scales if product_scales is not None else (out, out)
    if rows:
        _rms_norm_kernel[(rows,)](
            x, res_in, weight, out, res_out, scale, x_scale, w_scale, s0, s1, n, n, n, per_group, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n), FP8_OUT=fp8,
            SCALED_IN=product_scales is not None, MIN_SCALE=fp8_min_scale if fp8 else 0.0,
            ROUND_FIRST=ROUND_BEFORE_FP8_CAST, **pdl_launch(x.device),
        )
    normed = (out, scale) if fp8 else out
    return normed if residual is None else (normed, res_out)


@triton.jit
def _load_halves(ptr, t, stride_t, stride_h, num, dims, dmask, x_scale_ptr, w_scale_ptr, col0, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, SCALED_IN: tl.constexpr):
    """Token ``t``'s heads ``[BLOCK_H, HALF]`` twice (each head's two halves), their pointers and mask. With
    ``SCALED_IN`` they are a slice of an FP8 qkv product with unit scales, starting at column ``col0``, scaled here."""
    heads = tl.arange(0, BLOCK_H)
    mask = (heads[:, None] < num) & dmask[None, :]
    base = ptr + t * stride_t + heads[:, None] * stride_h + dims[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    if SCALED_IN:
        cols = col0 + heads[:, None] * (2 * HALF) + dims[None, :]
        x1 = scale_product_row(x1, x_scale_ptr, w_scale_ptr, t, cols, mask, ptr.dtype.element_ty)
        x2 = scale_product_row(x2, x_scale_ptr, w_scale_ptr, t, cols + HALF, mask, ptr.dtype.element_ty)
    return x1, x2, base, mask


@triton.jit
def _rotate_heads(ptr, t, stride_t, stride_h, num, cos, sin, dims, dmask, x_scale_ptr, w_scale_ptr, col0,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, SCALED_IN: tl.constexpr):
    x1, x2, base, mask = _load_halves(ptr, t, stride_t, stride_h, num, dims, dmask, x_scale_ptr, w_scale_ptr, col0,
                                      HALF, BLOCK_H, SCALED_IN)
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base, (x1 * cos - x2 * sin).to(ptr.dtype.element_ty), mask=mask)
    tl.store(base + HALF, (x2 * cos + x1 * sin).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _scale_heads(ptr, t, stride_t, stride_h, num, dims, dmask, x_scale_ptr, w_scale_ptr, col0, HALF: tl.constexpr,
                 BLOCK_H: tl.constexpr, SCALED_IN: tl.constexpr):
    """The values' heads of an FP8 qkv product, scaled in place (nothing without ``SCALED_IN``)."""
    if SCALED_IN:
        x1, x2, base, mask = _load_halves(ptr, t, stride_t, stride_h, num, dims, dmask, x_scale_ptr, w_scale_ptr, col0,
                                          HALF, BLOCK_H, SCALED_IN)
        tl.store(base, x1, mask=mask)
        tl.store(base + HALF, x2, mask=mask)


@triton.jit
def _token_angles(cos_ptr, sin_ptr, pos_ptr, t, stride_c, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """cos and sin ``[1, BLOCK_HALF]`` of token ``t``'s position, with the half-head offsets and their mask."""
    pos = tl.load(pos_ptr + t)
    dims = tl.arange(0, BLOCK_HALF)
    dmask = dims < HALF
    cos = tl.load(cos_ptr + pos * stride_c + dims, mask=dmask, other=0.0)[None, :]
    sin = tl.load(sin_ptr + pos * stride_c + dims, mask=dmask, other=0.0)[None, :]
    return cos, sin, dims, dmask


@triton.jit
def _rotary_kernel(q_ptr, k_ptr, v_ptr, x_scale_ptr, w_scale_ptr, cos_ptr, sin_ptr, pos_ptr, stride_qt, stride_qh, stride_kt,
                   stride_kh, stride_vt, stride_vh, stride_c, NUM_Q: tl.constexpr, NUM_K: tl.constexpr, HALF: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, SCALED_IN: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0)
    cos, sin, dims, dmask = _token_angles(cos_ptr, sin_ptr, pos_ptr, t, stride_c, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, t, stride_qt, stride_qh, NUM_Q, cos, sin, dims, dmask, x_scale_ptr, w_scale_ptr, 0, HALF, BLOCK_H, SCALED_IN)
    _rotate_heads(k_ptr, t, stride_kt, stride_kh, NUM_K, cos, sin, dims, dmask, x_scale_ptr, w_scale_ptr, NUM_Q * 2 * HALF,
                  HALF, BLOCK_H, SCALED_IN)
    _scale_heads(v_ptr, t, stride_vt, stride_vh, NUM_K, dims, dmask, x_scale_ptr, w_scale_ptr, (NUM_Q + NUM_K) * 2 * HALF,
                 HALF, BLOCK_H, SCALED_IN)


def _qkv_product(q, k, v, product_scales):
    """The launch arguments of an FP8 qkv product's scales: ``q``, ``k`` and ``v`` must be its three column slices,
    in that order (``product_scales``: ``x_scale [T, 1]``, ``weight_scale`` over all three)."""
    if product_scales is None:
        return q, q, q, False
    def follows(part, before):  # ``part``'s columns start where ``before``'s end, in each row
        return part.data_ptr() == before.data_ptr() + before.shape[1] * before.shape[2] * before.element_size()

    if v is None or not (follows(k, q) and follows(v, k)):
        raise ValueError("an FP8 qkv product's scales need q, k and v as the slices of one product, in that order")
    return v, *product_scales, True


def rotary_inplace(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_cache: torch.Tensor, sin_cache: torch.Tensor,
                   v: torch.Tensor | None = None, product_scales: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Rotate q ``[T, heads, d]`` and k ``[T, kv_heads, d]`` in place (NeoX halves); caches ``[max_pos, d]`` float32.
    With ``product_scales`` (``x_scale [T, 1]``, ``weight_scale [(heads + 2 kv_heads) d]``), q, k and v
    ``[T, kv_heads, d]`` are the slices of an FP8 qkv product with unit scales: all three are scaled (as
    ``scale_fp8_product`` would), q and k as they are rotated, v in place."""
    num_tokens, num_q, head_dim = q.shape
    v, x_scale, w_scale, scaled_in = _qkv_product(q, k, v, product_scales)
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            q, k, v, x_scale, w_scale, cos_cache, sin_cache, positions, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            v.stride(0), v.stride(1), cos_cache.stride(0), NUM_Q=num_q, NUM_K=k.shape[1], HALF=head_dim // 2,
            BLOCK_H=triton.next_power_of_2(max(num_q, k.shape[1])), BLOCK_HALF=triton.next_power_of_2(head_dim // 2),
            SCALED_IN=scaled_in, **pdl_launch(q.device),
        )
    return q, k


@triton.jit
def _norm_rotate_heads(src_ptr, dst_ptr, w_ptr, t, stride_t, stride_h, num, cos, sin, eps, dims, dmask, x_scale_ptr,
                       w_scale_ptr, col0, HALF: tl.constexpr, BLOCK_H: tl.constexpr, SCALED_IN: tl.constexpr):
    """RMSNorm of each head of token ``t`` (as ``rms_norm``: float32 inside, the model's dtype out),
    then its NeoX rotation (as ``_rotate_heads``), written to the contiguous ``dst``."""
    heads = tl.arange(0, BLOCK_H)
    x1, x2, _, mask = _load_halves(src_ptr, t, stride_t, stride_h, num, dims, dmask, x_scale_ptr, w_scale_ptr, col0,
                                   HALF, BLOCK_H, SCALED_IN)
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
    dtype = src_ptr.dtype.element_ty
    w1 = tl.load(w_ptr + dims, mask=dmask, other=0.0)[None, :]
    w2 = tl.load(w_ptr + HALF + dims, mask=dmask, other=0.0)[None, :]
    y1 = (w1 * (x1 * inv_rms).to(dtype)).to(dtype).to(tl.float32)
    y2 = (w2 * (x2 * inv_rms).to(dtype)).to(dtype).to(tl.float32)
    dst = dst_ptr + (t * num + heads[:, None]) * (2 * HALF) + dims[None, :]
    tl.store(dst, (y1 * cos - y2 * sin).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (y2 * cos + y1 * sin).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qk_norm_rotary_kernel(q_ptr, k_ptr, v_ptr, q_out_ptr, k_out_ptr, qw_ptr, kw_ptr, x_scale_ptr, w_scale_ptr, cos_ptr, sin_ptr,
                           pos_ptr, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_c, eps,
                           NUM_Q: tl.constexpr, NUM_K: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_HALF: tl.constexpr, SCALED_IN: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0)
    cos, sin, dims, dmask = _token_angles(cos_ptr, sin_ptr, pos_ptr, t, stride_c, HALF, BLOCK_HALF)
    _norm_rotate_heads(q_ptr, q_out_ptr, qw_ptr, t, stride_qt, stride_qh, NUM_Q, cos, sin, eps, dims, dmask,
                       x_scale_ptr, w_scale_ptr, 0, HALF, BLOCK_H, SCALED_IN)
    _norm_rotate_heads(k_ptr, k_out_ptr, kw_ptr, t, stride_kt, stride_kh, NUM_K, cos, sin, eps, dims, dmask,
                       x_scale_ptr, w_scale_ptr, NUM_Q * 2 * HALF, HALF, BLOCK_H, SCALED_IN)
    _scale_heads(v_ptr, t, stride_vt, stride_vh, NUM_K, dims, dmask, x_scale_ptr, w_scale_ptr, (NUM_Q + NUM_K) * 2 * HALF,
                 HALF, BLOCK_H, SCALED_IN)


def qk_norm_rotary(positions, q, k, q_weight, k_weight, eps: float, cos_cache, sin_cache, v: torch.Tensor | None = None,
                   product_scales: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Qwen3's per-head q/k RMSNorm followed by rotary, in one launch instead of three: q ``[T, heads, d]``
    and k ``[T, kv_heads, d]`` (rows may be strided, e.g. views of the qkv output) -> new contiguous q, k.
    ``v`` and ``product_scales``: an FP8 qkv product with unit scales, as ``rotary_inplace`` takes it."""
    num_tokens, num_q, head_dim = q.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    v, x_scale, w_scale, scaled_in = _qkv_product(q, k, v, product_scales)
    if num_tokens:
        _qk_norm_rotary_kernel[(num_tokens,)](
            q, k, v, q_out, k_out, q_weight, k_weight, x_scale, w_scale, cos_cache, sin_cache, positions,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos_cache.stride(0), eps,
            NUM_Q=num_q, NUM_K=k.shape[1], HALF=head_dim // 2, BLOCK_H=triton.next_power_of_2(max(num_q, k.shape[1])),
            BLOCK_HALF=triton.next_power_of_2(head_dim // 2), SCALED_IN=scaled_in, **pdl_launch(q.device),
        )
    return q_out, k_out


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_wait(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + t * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + t * stride_x + n + cols, mask=mask, other=0.0)
    silu = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + t * stride_o + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_and_mul_fp8_kernel(x_ptr, q_ptr, scale_ptr, stride_x, stride_q, n, BLOCK: tl.constexpr,
                             MIN_SCALE: tl.constexpr, ROUND_FIRST: tl.constexpr):
    """A whole row a program: SiLU-and-mul in the model's dtype, then its per-token FP8 quantization."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(x_ptr + t * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + t * stride_x + n + cols, mask=mask, other=0.0)
    y = ((gate / (1.0 + tl.exp(-gate))).to(up.dtype) * up).to(up.dtype)
    quantize_row(y.to(tl.float32), q_ptr + t * stride_q + cols, mask, scale_ptr + t, FP8_MAX, MIN_SCALE, ROUND_FIRST)


def silu_and_mul(x: torch.Tensor, fp8_min_scale: float | None = None):
    """``[T, 2n]`` (gate then up) -> ``[T, n]``; with ``fp8_min_scale``, quantized per token:
    ``(float8 values [T, n], float32 scales [T, 1])``."""
    num_tokens, two_n = x.shape
    n = two_n // 2
    if fp8_min_scale is not None and n > ONE_PASS_MAX:  # a row too long for one program's registers
        return per_token_quant_fp8(silu_and_mul(x), fp8_min_scale)
    if fp8_min_scale is not None:
        q = torch.empty((num_tokens, n), dtype=torch.float8_e4m3fn, device=x.device)
        scale = torch.empty((num_tokens, 1), dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(n)
        if num_tokens:
            _silu_and_mul_fp8_kernel[(num_tokens,)](x, q, scale, x.stride(0), q.stride(0), n, BLOCK=block,
                                                    MIN_SCALE=fp8_min_scale, ROUND_FIRST=ROUND_BEFORE_FP8_CAST,
                                                    num_warps=min(16, max(4, block // 1024)))
        return q, scale
    out = torch.empty((num_tokens, n), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(n))
    if num_tokens:
        _silu_and_mul_kernel[(num_tokens, triton.cdiv(n, block))](x, out, x.stride(0), out.stride(0), n, BLOCK=block,
                                                                   **pdl_launch(x.device))
    return out
