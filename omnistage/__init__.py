"""omnistage: an inference engine for omni-modal models.

from omnistage import LLM, SamplingParams

The names below are imported on first use, so `import omnistage` (and every
child process the engine starts, which runs `python -m omnistage.child`)
costs milliseconds, not the seconds torch and transformers take.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config import EngineConfig
    from omnistage.entrypoints.llm import LLM
    from omnistage.outputs import CompletionOutput, Logprob, RequestOutput
    from omnistage.sampling_params import SamplingParams

_LAZY = {
    "LLM": "omnistage.entrypoints.llm",
    "CompletionOutput": "omnistage.outputs",
    "EngineConfig": "omnistage.config",
    "Logprob": "omnistage.outputs",
    "RequestOutput": "omnistage.outputs",
    "SamplingParams": "omnistage.sampling_params",
}

__all__ = [
    "LLM",
    "CompletionOutput",
    "EngineConfig",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omnistage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
