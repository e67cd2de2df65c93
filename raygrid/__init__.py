"""raygrid: an LLM inference engine of the vLLM class, from one device to a Ray cluster.

The public names are imported on first use, so that ``import raygrid`` (and ``raygrid --help``) does not
pay for torch and transformers until an engine is built."""

from __future__ import annotations

import importlib

__all__ = ["LLM", "LLMEngine", "EngineArgs", "SamplingParams", "StructuredOutputsParams", "RequestOutput", "CompletionOutput",
           "Logprob"]
__version__ = "0.1.0"

_HOMES = {
    "LLM": "raygrid.engine.llm",
    "LLMEngine": "raygrid.engine.llm_engine",
    "EngineArgs": "raygrid.engine.arg_utils",
    "SamplingParams": "raygrid.engine.sampling_params",
    "StructuredOutputsParams": "raygrid.engine.sampling_params",
    "RequestOutput": "raygrid.engine.outputs",
    "CompletionOutput": "raygrid.engine.outputs",
    "Logprob": "raygrid.engine.outputs",
}


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raygrid' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_HOMES))
