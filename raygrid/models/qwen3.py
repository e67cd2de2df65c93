"""Qwen3: the Llama decoder with RMSNorm on each query and key head before rotary embedding."""

from __future__ import annotations

from raygrid.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
