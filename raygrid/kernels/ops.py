"""The model's hot-path operations: Triton kernels for tensors on a GPU, torch references elsewhere.

``RAYGRID_USE_TRITON=0`` forces the references on GPU too (for comparisons and debugging).
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from raygrid.kernels.elementwise_ref import MIN_SCALE, apply_rotary_ref, quantize_per_token, rms_norm_ref, silu_and_mul_ref
from raygrid.kernels.moe_ref import fused_moe_ref
from raygrid.kernels.paged_attention_ref import paged_attention_ref, store_kv_ref
from raygrid.kernels.sampling_ref import (
    Penalties,
    apply_penalties_ref,
    apply_token_bitmask_ref,
    gumbel_argmax_ref,
    logprob_stats_ref,
    seeded_uniform,
)

if TYPE_CHECKING:
    from raygrid.kernels.triton_attention import PromptLaunch

_TRITON_ALLOWED = os.environ.get("RAYGRID_USE_TRITON", "1") != "0"
# Rows up to which linear layers use the skinny kernel (triton_linear.SKINNY_MAX_M; 0 turns it off), and
# the largest weight it takes: on an H200 cuBLAS already streams weights of 16M elements and more (the 8B
# shape's) at 2 to 3.4 TB/s, and the skinny kernel gained nothing there (benchmarks/README.md).
_SKINNY_MAX_M = min(16, int(os.environ.get("RAYGRID_SKINNY_MAX_M", "16")))
_SKINNY_MAX_WEIGHT = 8 * 1024 * 1024


def use_triton(t: torch.Tensor) -> bool:
    return t.is_cuda and _TRITON_ALLOWED


class Fp8Activation(NamedTuple):
    """An FP8 layer's input ``[T, K]`` already quantized per token (``elementwise_ref.quantize_per_token``) by the
    kernel that produced it: ``rms_norm`` or ``silu_and_mul`` with ``fp8=True``."""

    values: torch.Tensor  # float8 e4m3 [T, K]
    scale: torch.Tensor  # float32 [T, 1]
    dtype: torch.dtype  # the model's, which the product comes back in


class Fp8Product(NamedTuple):
    """An FP8 layer's output before its scales: ``values [T, N]``, the product of the float8 input and weight with
    unit scales in the model's dtype, to be scaled by ``x_scale [T, 1]`` per token and ``weight_scale [N]`` per
    channel (as ``triton_quant.scale_fp8_product`` does). Small batches' FP8 layers hand this over when asked
    (``linear(..., defer_scale=True)``) so that the kernel reading the output next scales it as it loads it instead
    of a launch of its own: RMSNorm after o_proj and down_proj, rotary (or Qwen3's q/k norms with rotary) after
    qkv_proj. ``scaled`` gives the plain tensor, in place: a product is read once."""

    values: torch.Tensor
    x_scale: torch.Tensor
    weight_scale: torch.Tensor

    def scaled(self) -> torch.Tensor:
        if use_triton(self.values):
            from raygrid.kernels.triton_quant import scale_fp8_product

            return scale_fp8_product(self.values, self.x_scale, self.weight_scale, None)
        return (self.values.float() * self.x_scale * self.weight_scale).to(self.values.dtype)


def scaled(x: torch.Tensor | Fp8Product) -> torch.Tensor:
    """``x`` as a plain tensor (an ``Fp8Product`` scaled)."""
    return x.scaled() if isinstance(x, Fp8Product) else x


def linear(x: torch.Tensor | Fp8Activation, weight: torch.Tensor, bias: torch.Tensor | None = None,
           weight_scale: torch.Tensor | None = None, defer_scale: bool = False) -> torch.Tensor | Fp8Product:
    """``x @ weight.T + bias``. FP8 weights (with per-channel ``weight_scale``) go through ``torch._scaled_mm`` on a
    GPU, their reference elsewhere, and take ``x`` quantized already (``Fp8Activation``) or quantize it here; small
    decode batches through the skinny Triton kernel; the rest through cuBLAS. ``defer_scale``: the caller takes an
    ``Fp8Product`` where the FP8 product would be scaled by a launch of its own (small batches on a GPU, no bias)."""
    if isinstance(x, Fp8Activation):
        if weight_scale is None:
            raise ValueError("linear: an Fp8Activation input needs FP8 weights (weight_scale)")
        return _fp8_linear_quantized(x, weight, weight_scale, bias, defer_scale)
    if weight_scale is not None:
        return _fp8_linear(x, weight, weight_scale, bias, defer_scale)
    if (use_triton(x) and x.dim() == 2 and x.shape[0] <= _SKINNY_MAX_M and weight.numel() <= _SKINNY_MAX_WEIGHT
            and x.dtype in (torch.bfloat16, torch.float16)):
        from raygrid.kernels.triton_linear import skinny_linear

        return skinny_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def _fp8_linear(x, weight, weight_scale, bias, defer_scale=False):
    from raygrid.kernels.triton_quant import per_token_quant_fp8
    from raygrid.models.layers.fp8 import fp8_linear_ref

    if not use_triton(x):
        return fp8_linear_ref(x, weight, weight_scale, bias)
    x2 = x.reshape(-1, x.shape[-1])
    y = _fp8_linear_quantized(Fp8Activation(*per_token_quant_fp8(x2, MIN_SCALE), x.dtype), weight, weight_scale, bias,
                              defer_scale and x.dim() == 2)
    return y if isinstance(y, Fp8Product) else y.reshape(*x.shape[:-1], weight.shape[0])


def _fp8_linear_quantized(x: Fp8Activation, weight, weight_scale, bias, defer_scale=False):
    from raygrid.models.layers.fp8 import fp8_product_ref

    if not use_triton(x.values):
        return fp8_product_ref(x.values, x.scale, weight, weight_scale, bias, x.dtype)
    if x.values.shape[0] > FP8_TENSORWISE_MAX_M:
        return fp8_product_rowwise(x.values, x.scale, weight, weight_scale, bias, x.dtype)
    if defer_scale and bias is None and FP8_DEFER_SCALE:
        return Fp8Product(fp8_product_unscaled(x.values, weight, x.dtype), x.scale, weight_scale)
    return fp8_product_tensorwise(x.values, x.scale, weight, weight_scale, bias, x.dtype)


# Rows up to which FP8 layers multiply with unit scales (cuBLASLt) and scale the product after, instead of
# torch._scaled_mm's row-wise scaling (CUTLASS), which is slower than bf16 for small batches on an H200
# (benchmarks/scripts/sweep_fp8_linear.py, benchmarks/README.md).
FP8_TENSORWISE_MAX_M = int(os.environ.get("RAYGRID_FP8_TENSORWISE_MAX_M", "256"))
# Hopper's FP8 products accumulate in the tensor cores' own precision, promoted to float32 only at the end with
# use_fast_accum, as vLLM's CUTLASS kernels for sm90 do (its "FP8FastAccum" schedules); without it, every few
# steps of K. On an H200 it took W1 on the 8B shape (FP8 weights and cache) from 13,868 to 14,336 output tok/s
# (benchmarks/README.md). RAYGRID_FP8_FAST_ACCUM=0 turns it off.
FP8_FAST_ACCUM = os.environ.get("RAYGRID_FP8_FAST_ACCUM", "1") == "1"
# Whether those small batches' layers may leave their product's scaling to the kernel that reads it next
# (Fp8Product): RAYGRID_FP8_DEFER_SCALE=0 scales every product in a launch of its own, for A/B runs.
FP8_DEFER_SCALE = os.environ.get("RAYGRID_FP8_DEFER_SCALE", "1") == "1"


def fp8_product_rowwise(x_q, x_scale, weight, weight_scale, bias, dtype):
    """A scale per token of x and per output channel of the weight, applied in the GEMM's epilogue."""
    y = torch._scaled_mm(x_q, weight.t(), scale_a=x_scale, scale_b=weight_scale.view(1, -1), out_dtype=dtype,
                         use_fast_accum=FP8_FAST_ACCUM)
    return y if bias is None else y + bias


def fp8_product_tensorwise(x_q, x_scale, weight, weight_scale, bias, dtype):
    """Unit scales, then both scales (and the bias) applied by one small kernel."""
    from raygrid.kernels.triton_quant import scale_fp8_product

    return scale_fp8_product(fp8_product_unscaled(x_q, weight, dtype), x_scale, weight_scale, bias)


def fp8_product_unscaled(x_q, weight, dtype):
    one = _unit_scale(x_q.device)
    return torch._scaled_mm(x_q, weight.t(), scale_a=one, scale_b=one, out_dtype=dtype, use_fast_accum=FP8_FAST_ACCUM)


@functools.cache
def _unit_scale(device: torch.device) -> torch.Tensor:
    return torch.ones((), dtype=torch.float32, device=device)


def rms_norm(x: torch.Tensor | Fp8Product, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
             fp8: bool = False):
    """``norm(x)``, or ``(norm(x + residual), x + residual)``; with ``fp8`` the norm comes as an ``Fp8Activation``
    for the FP8 layer it feeds (one kernel on a GPU: the norm is not written in the model's dtype first). An
    ``Fp8Product`` ``x`` is scaled as the kernel loads it."""
    values, product_scales = (x.values, (x.x_scale, x.weight_scale)) if isinstance(x, Fp8Product) else (x, None)
    if use_triton(values):
        from raygrid.kernels.triton_ops import rms_norm as triton_rms_norm

        result = triton_rms_norm(values, weight, eps, residual, fp8_min_scale=MIN_SCALE if fp8 else None,
                                 product_scales=product_scales)
        normed = result if residual is None else result[0]
        if fp8:
            normed = Fp8Activation(*normed, values.dtype)
        return normed if residual is None else (normed, result[1])
    x = scaled(x)
    if residual is not None:
        x = x + residual
    normed = rms_norm_ref(x, weight, eps)
    if fp8:
        normed = Fp8Activation(*quantize_per_token(normed), x.dtype)
    return normed if residual is None else (normed, x)


def silu_and_mul(x: torch.Tensor, fp8: bool = False) -> torch.Tensor | Fp8Activation:
    """SiLU(gate) * up of ``[T, 2n]``; with ``fp8``, as an ``Fp8Activation`` for the FP8 layer it feeds."""
    if use_triton(x):
        from raygrid.kernels.triton_ops import silu_and_mul as triton_silu_and_mul

        if fp8:
            return Fp8Activation(*triton_silu_and_mul(x, fp8_min_scale=MIN_SCALE), x.dtype)
        return triton_silu_and_mul(x)
    y = silu_and_mul_ref(x)
    return Fp8Activation(*quantize_per_token(y), x.dtype) if fp8 else y


def fused_moe(hidden, w13, w2, topk_weights, topk_ids, experts_elsewhere: bool = False) -> torch.Tensor:
    """Each token through its top-k experts, weighted and summed (``moe_ref.fused_moe_ref``). ``experts_elsewhere``:
    some ids (>= E) name experts other ranks hold, whose pairs add nothing here (expert parallelism)."""
    if use_triton(hidden):
        from raygrid.kernels.triton_moe import fused_moe as triton_fused_moe

        return triton_fused_moe(hidden, w13, w2, topk_weights, topk_ids, experts_elsewhere=experts_elsewhere)
    return fused_moe_ref(hidden, w13, w2, topk_weights, topk_ids)


def rotary(positions, q, k, cos_cache, sin_cache, v=None, product_scales=None):
    """Rotary on q ``[T, heads, d]`` and k ``[T, kv_heads, d]``. With ``v`` and ``product_scales`` (``x_scale
    [T, 1]``, ``weight_scale``), q, k and v are the slices of an FP8 qkv product (``Fp8Product``) scaled here too,
    v in place."""
    if use_triton(q):
        from raygrid.kernels.triton_ops import rotary_inplace

        return rotary_inplace(positions, q, k, cos_cache, sin_cache, v, product_scales)
    if product_scales is not None:
        q, k = _scale_qkv_ref(q, k, v, *product_scales)
    cos = cos_cache[positions].to(q.dtype).unsqueeze(1)
    sin = sin_cache[positions].to(q.dtype).unsqueeze(1)
    return apply_rotary_ref(q, cos, sin), apply_rotary_ref(k, cos, sin)


def qk_norm_rotary(positions, q, k, q_weight, k_weight, eps: float, cos_cache, sin_cache, v=None, product_scales=None):
    """Per-head RMSNorm of q and k (Qwen3), then rotary: new q ``[T, heads, d]`` and k ``[T, kv_heads, d]``. ``v``
    and ``product_scales``: an FP8 qkv product, as ``rotary`` takes it."""
    if use_triton(q):
        from raygrid.kernels.triton_ops import qk_norm_rotary as triton_qk_norm_rotary

        return triton_qk_norm_rotary(positions, q, k, q_weight, k_weight, eps, cos_cache, sin_cache, v, product_scales)
    if product_scales is not None:
        q, k = _scale_qkv_ref(q, k, v, *product_scales)
    return rotary(positions, rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps), cos_cache, sin_cache)


def _scale_qkv_ref(q, k, v, x_scale, weight_scale):
    """The slices of an FP8 qkv product scaled: new q and k, v in place."""
    scaled = []
    widths = [part.shape[1] * part.shape[2] for part in (q, k, v)]
    for part, scale in zip((q, k, v), weight_scale.split(widths)):
        scaled.append(Fp8Product(part.reshape(part.shape[0], -1), x_scale, scale).scaled().view(part.shape))
    v.copy_(scaled[2])
    return scaled[0], scaled[1]


def store_kv(key, value, kv_cache, slot_mapping) -> None:
    if use_triton(key):
        from raygrid.kernels.triton_attention import store_kv as triton_store_kv

        triton_store_kv(key, value, kv_cache, slot_mapping)
    else:
        store_kv_ref(key, value, kv_cache, slot_mapping)


def prefill_launch(num_tokens: int, num_seqs: int) -> dict:
    """The tile shape the GPU's prefill attention kernel takes for a batch by its shapes (a CUDA graph captures one)."""
    from raygrid.kernels.triton_attention import prefill_launch as triton_prefill_launch

    return triton_prefill_launch(num_tokens, num_seqs)


def prompt_launch_for(query_start_loc: list[int], seq_lens: list[int]) -> PromptLaunch:
    """How the GPU's attention launches for a step with prompt tokens whose query and context lengths the host knows:
    its leading decode rows by the decode kernel, the rest by the prefill kernel with tiles for those lengths
    (``triton_attention.prompt_launch_for``, a ``PromptLaunch``)."""
    from raygrid.kernels.triton_attention import prompt_launch_for as triton_prompt_launch_for

    return triton_prompt_launch_for(query_start_loc, seq_lens)


def paged_attention(query, kv_cache, meta, scale: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of the step's packed queries over the paged cache (see AttentionMetadata), into ``out`` if given."""
    if use_triton(query):
        from raygrid.kernels.triton_attention import paged_attention_decode, paged_attention_prefill, paged_attention_split

        if meta.decode_only:
            return paged_attention_decode(query, kv_cache, meta.block_tables, meta.seq_lens_tensor, scale, out=out,
                                          order=meta.decode_order)
        launch = meta.prompt_launch
        if launch is not None and launch.decode_rows:
            return paged_attention_split(query, kv_cache, meta.block_tables, meta.seq_lens_tensor,
                                         meta.query_start_loc_tensor, scale, launch.decode_rows, out=out, launch=launch.tiles,
                                         order=meta.decode_order)
        return paged_attention_prefill(query, kv_cache, meta.block_tables, meta.seq_lens_tensor, meta.query_start_loc_tensor,
                                       scale, out=out, launch=None if launch is None else launch.tiles)
    result = paged_attention_ref(query, kv_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale)
    return result if out is None else out.copy_(result)


def gumbel_argmax(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, penalties: Penalties | None = None) -> torch.Tensor:
    """Draw one token per row from softmax(logits / temperature); rows below temperature 1e-5 are greedy.
    The noise of row i comes from its seed: a Philox stream in the Triton kernel, a torch generator on CPU.
    ``penalties``: applied to the logits first, in the same pass on a GPU (the logits are read once, in their dtype)."""
    if use_triton(logits):
        from raygrid.kernels.triton_sampling import gumbel_argmax as triton_gumbel_argmax

        return triton_gumbel_argmax(logits, temperature, seeds, penalties)
    if penalties is not None:
        logits = apply_penalties_ref(logits.to(torch.float32, copy=True), penalties)
    return gumbel_argmax_ref(logits, temperature, seeded_uniform(seeds.tolist(), logits.shape[1], logits.device))


def apply_penalties(logits: torch.Tensor, penalties: Penalties) -> torch.Tensor:
    """Repetition, frequency and presence penalties, in place on float32 ``logits [B, V]``
    (``sampling_ref.apply_penalties_ref``)."""
    if use_triton(logits):
        from raygrid.kernels.triton_sampling import apply_penalties as triton_apply_penalties

        return triton_apply_penalties(logits, penalties)
    return apply_penalties_ref(logits, penalties)


def logprob_stats(logits: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row of raw logits: log-sum-exp, the logit of ``tokens[i]`` and its 1-based rank (``sampling_ref.logprob_stats_ref``)."""
    if use_triton(logits):
        from raygrid.kernels.triton_sampling import logprob_stats as triton_logprob_stats

        return triton_logprob_stats(logits, tokens)
    return logprob_stats_ref(logits, tokens)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor, mask_rows: torch.Tensor) -> None:
    """Structured outputs, in place: row ``rows[i]`` of the logits keeps only the tokens whose bit is set in
    ``bitmask[mask_rows[i]]`` (int32 words, bit t % 32 of word t // 32); the others become -inf."""
    if use_triton(logits):
        from raygrid.kernels.triton_sampling import apply_token_bitmask as triton_apply_token_bitmask

        triton_apply_token_bitmask(logits, bitmask, rows, mask_rows)
    else:
        apply_token_bitmask_ref(logits, bitmask, rows, mask_rows)
