"""raygrid: an LLM inference engine of the vLLM class, from one device to a Ray cluster."""

from raygrid.engine.llm import LLM
from raygrid.engine.outputs import CompletionOutput, Logprob, RequestOutput
from raygrid.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "Logprob"]
__version__ = "0.1.0"
