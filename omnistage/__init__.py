"""omnistage: an inference engine for omni-modal models.

from omnistage import LLM, SamplingParams
"""

from omnistage.config import EngineConfig
from omnistage.entrypoints.llm import LLM
from omnistage.outputs import CompletionOutput, Logprob, RequestOutput
from omnistage.sampling_params import SamplingParams

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"
