"""The memory floor of a decode step: the bytes a step must read from device memory (the weights it
touches and the KV cache it attends over) at the device's bandwidth. A decode step cannot be faster;
how close a step comes to it says how much is left to gain.

The bandwidth is measured on the GPU the benchmark runs on (``copy_bandwidth``): a large device-to-device
copy, the most a streaming kernel can expect, which is below the paper figure (an H200 copies at about
4.2 TB/s of its 4.8). A CPU run has no floor: the figure is for GPUs' memory."""

from __future__ import annotations

H200_BANDWIDTH = 4.2e12  # bytes/s: what a large device-to-device copy reaches on an H200 (4.8 TB/s on paper)


def copy_bandwidth(device, num_bytes: int = 2**30, repeats: int = 10) -> float | None:
    """Bytes/s moved (read plus written) by a ``num_bytes`` device-to-device copy on a CUDA ``device``, the best of
    ``repeats``; None for any other device. Its buffers are freed before it returns."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return None
    with torch.cuda.device(device):
        src = torch.empty(num_bytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        dst.copy_(src)  # the first copy pays for any lazy initialization
        best = float("inf")
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        del src, dst
        torch.cuda.empty_cache()
    return 2 * num_bytes / best


def is_moe_layer(hf_config, layer: int) -> bool:
    return (getattr(hf_config, "num_experts", 0) > 0 and layer not in (getattr(hf_config, "mlp_only_layers", None) or [])
            and (layer + 1) % getattr(hf_config, "decoder_sparse_step", 1) == 0)


def experts_touched(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Expected experts that receive at least one of ``num_tokens`` tokens under uniform routing."""
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


def decode_floor(hf_config, num_reqs: int, context_tokens: int, dtype_bytes: int = 2,
                 bandwidth: float = H200_BANDWIDTH, quantization: str | None = None, kv_cache_dtype: str = "auto") -> dict:
    """One decode step of ``num_reqs`` requests that attend over ``context_tokens`` tokens in all (one
    device, no parallelism): bytes of weights touched, bytes of KV read, and the floor in ms. ``dtype_bytes`` is
    the model's dtype; under ``quantization="fp8"`` the dense linear layers take one byte a weight, and an FP8
    ``kv_cache_dtype`` one byte an element."""
    c = hf_config
    hidden, layers = c.hidden_size, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or hidden // c.num_attention_heads
    linear = layers * hidden * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    other = c.vocab_size * hidden + num_reqs * hidden  # the head, and the embedding rows
    for layer in range(layers):
        if is_moe_layer(c, layer):
            touched = experts_touched(c.num_experts, c.num_experts_per_tok, num_reqs)
            other += touched * 3 * hidden * c.moe_intermediate_size + c.num_experts * hidden
        else:
            linear += 3 * hidden * c.intermediate_size
    kv = layers * 2 * c.num_key_value_heads * head_dim * context_tokens
    weight_bytes = linear * (1 if quantization == "fp8" else dtype_bytes) + other * dtype_bytes
    kv_bytes = kv * (dtype_bytes if kv_cache_dtype == "auto" else 1)
    return {"weight_bytes": int(weight_bytes), "kv_bytes": int(kv_bytes), "bandwidth_bytes_per_s": bandwidth,
            "floor_ms": (weight_bytes + kv_bytes) / bandwidth * 1e3}
