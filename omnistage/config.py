"""Engine configuration: one frozen dataclass, validated on construction.

`EngineConfig` is what `LLM(...)`, the CLI and (later) a deploy file's
`engine_args` section build. Every field has a docstring; `__post_init__`
raises `ValueError` naming the field for any bad value. Values that depend on
the loaded model (its maximum context) are resolved by `resolve_for_model`.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.spec_decode.config import SpeculativeConfig

if TYPE_CHECKING:
    import torch

_DTYPES: dict[str, str] = {
    "float32": "float32",
    "float": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "float64": "float64",
    "double": "float64",
    "fp64": "float64",
}
"""Accepted dtype names -> the torch dtype's name (torch is imported only to convert:
the frontend checks a config without paying torch's import)."""

DEFAULT_MODEL = "smollm2"


def dtype_name(value: Any) -> str:
    """The canonical name ("float32", ...) of "float32" / "bf16" / torch.float64 / "auto"
    (`auto` → float32); a ValueError naming `dtype` for anything else."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.dtype):
        name = str(value).removeprefix("torch.")
        if name not in _DTYPES.values():
            raise ValueError(f"dtype: unsupported torch dtype {value}")
        return name
    if value == "auto":
        return "float32"
    try:
        return _DTYPES[str(value).lower()]
    except KeyError:
        raise ValueError(
            f"dtype: unknown dtype {value!r}; expected one of auto, {', '.join(sorted(_DTYPES))}"
        ) from None


def parse_dtype(value: Any) -> torch.dtype:
    """Turn "float32" / "bf16" / torch.float64 … into a torch dtype (`auto` → float32)."""
    import torch

    return getattr(torch, dtype_name(value))


@dataclass(frozen=True)
class EngineConfig:
    """Everything one autoregressive stage needs to know to build its engine."""

    model: str = DEFAULT_MODEL
    """Built-in model name (see `omnistage models`), an HF checkpoint directory, or a .gguf file."""

    model_part: str | None = None
    """Which part of a multi-part checkpoint this stage runs (e.g. "thinker" of Qwen3-Omni)."""

    dtype: str = "auto"
    """Weight and activation dtype: auto, float32, bfloat16, float16, float64. `auto` is
    float32 on the CPU, except that a GGUF model keeps its quantized weights as the file
    stores them (float32 activations); a named dtype dequantizes them. On a CUDA device
    `auto` is bfloat16 (a GGUF's weights dequantized to it)."""

    quant_activations: str | None = None
    """Products on a GGUF's kept quantized weights: "float32" (activations as they are, the
    product of the dequantized weight up to summation order) or "int8" (activations
    quantized per 32-block, integer dot products, as llama.cpp does: ~10 % faster decode
    on SmolLM2 Q4_1 here, outputs ~1 % of their scale away, so greedy text may differ).
    None: the OMNISTAGE_QUANT_ACTIVATIONS environment variable, else float32."""

    max_model_len: int | None = None
    """Longest prompt + output a request may have; defaults to the model's own context length."""

    max_num_seqs: int = 256
    """Most requests scheduled in one step."""

    max_num_batched_tokens: int | None = None
    """Token budget of one step (prompt chunks + decodes). Default: 2048 with chunked
    prefill, max_model_len without it."""

    enable_chunked_prefill: bool = True
    """Split long prompts across steps so they share steps with decodes."""

    enable_prefix_caching: bool = True
    """Reuse the KV cache of full blocks whose token prefix was computed before."""

    block_size: int = 16
    """Tokens per KV cache block."""

    kv_cache_memory_bytes: int | None = None
    """KV cache size as a byte budget. Mutually exclusive with num_kv_blocks."""

    gpu_memory_utilization: float = 0.9
    """On a CUDA device: the fraction of the device's memory this stage may take (weights,
    activations, KV cache); with neither `num_kv_blocks` nor `kv_cache_memory_bytes` given,
    the KV cache takes what is left of it once the model is loaded. The CPU ignores it."""

    enforce_eager: bool = False
    """On a CUDA device: run decode steps eagerly instead of replaying CUDA graphs
    (`platforms/cuda_graphs.py`). The CPU ignores it."""

    num_kv_blocks: int | None = None
    """KV cache size as a number of blocks. Default (neither given): enough blocks for
    max_num_seqs requests of max_model_len tokens, capped at 4 GiB."""

    async_scheduling: bool = True
    """Schedule step N+1 while step N runs (the runner works on a worker thread).
    Outputs are identical to synchronous scheduling; only speed differs."""

    executor_backend: str = "auto"
    """Where the model runner runs: inline (caller's thread), thread (a worker thread),
    process (a worker process), or auto: process with async scheduling, else inline."""

    stage_transitions: dict | None = None
    """Forced token sequences after trigger tokens, e.g. {"</think>": ["<recaption>"]}
    (keys: a token string, an id, or a tuple of them; values: token strings or ids)."""

    stage_budgets: dict | None = None
    """Section budgets: {close token: {"max_tokens": N, "after": open token (optional)}}
    forces the close token once N tokens of its section went by without it (e.g. a thinking
    budget: {"</think>": {"max_tokens": 512}})."""

    output_hidden_states: bool = False
    """Return the final hidden state of every computed position with each step's outputs
    (what a next stage conditions on, e.g. `hidden_states.output` in a pipeline)."""

    seed: int = 0
    """Engine seed: makes unseeded sampling reproducible run to run."""

    num_threads: int | None = None
    """Threads for this stage: torch intra-op and C kernels; default: all cores (torch: one
    for models with a hidden size under 256, see `Platform.configure_threads`)."""

    device: str = "cpu"
    """Device the stage runs on: cpu or cuda."""

    speculative_config: dict | None = None
    """Speculative decoding, as vLLM's: {"method": "ngram" | "draft_model" | "mtp",
    "num_speculative_tokens": k, ...} (a JSON string is accepted too); see
    `omnistage.spec_decode.config`. Outputs are the same as without it."""

    def __post_init__(self) -> None:
        dtype_name(self.dtype)
        spec = SpeculativeConfig.parse(self.speculative_config)
        if spec is not None:
            object.__setattr__(self, "speculative_config", dataclasses.asdict(spec))
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("model: must be a non-empty string (a built-in name or a path)")
        _positive("max_num_seqs", self.max_num_seqs)
        _positive("block_size", self.block_size)
        for name in ("max_model_len", "max_num_batched_tokens", "num_kv_blocks", "num_threads"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.kv_cache_memory_bytes is not None:
            _positive("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
            if self.num_kv_blocks is not None:
                raise ValueError("kv_cache_memory_bytes: give either it or num_kv_blocks, not both")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
            raise ValueError(
                "gpu_memory_utilization: expected a fraction in (0, 1], "
                f"got {self.gpu_memory_utilization!r}"
            )
        if self.quant_activations not in (None, "float32", "int8"):
            raise ValueError(
                f"quant_activations: expected float32 or int8, got {self.quant_activations!r}"
            )
        if self.executor_backend not in ("auto", "inline", "thread", "process"):
            raise ValueError(
                f"executor_backend: expected auto, inline, thread or process, got {self.executor_backend!r}"
            )
        if self.stage_transitions is not None and not isinstance(self.stage_transitions, dict):
            raise ValueError("stage_transitions: expected a dict of trigger -> forced tokens")
        if self.stage_budgets is not None and not isinstance(self.stage_budgets, dict):
            raise ValueError("stage_budgets: expected a dict of close token -> budget")
        if self.device not in ("cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: expected cpu or cuda, got {self.device!r}")
        if (
            not self.enable_chunked_prefill
            and self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "max_num_batched_tokens: must be >= max_model_len when chunked prefill is off, "
                f"got {self.max_num_batched_tokens} < {self.max_model_len}"
            )

    @property
    def resolved_executor_backend(self) -> str:
        if self.executor_backend != "auto":
            return self.executor_backend
        return "process" if self.async_scheduling else "inline"

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The parsed `speculative_config` (None: no speculation)."""
        return SpeculativeConfig.parse(self.speculative_config)

    @property
    def keeps_quantized_weights(self) -> bool:
        """A GGUF model's quantized weights stay quantized (`dtype` left at auto, on the CPU:
        the quantized products are C kernels)."""
        return self.dtype == "auto" and self.device == "cpu"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the stage computes in: `dtype`, with `auto` float32 on the CPU and
        bfloat16 on a CUDA device."""
        if self.dtype == "auto" and self.device != "cpu":
            return parse_dtype("bfloat16")
        return parse_dtype(self.dtype)

    def resolve_for_model(self, model_max_len: int) -> EngineConfig:
        """Fill the values that default from the model (context length, token budget)."""
        max_model_len = self.max_model_len or model_max_len
        if max_model_len > model_max_len:
            raise ValueError(
                f"max_model_len: {max_model_len} exceeds the model's context length {model_max_len}"
            )
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = 2048 if self.enable_chunked_prefill else max_model_len
        return dataclasses.replace(self, max_model_len=max_model_len, max_num_batched_tokens=budget)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: must be a positive integer, got {value!r}")
