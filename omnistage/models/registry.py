"""Registry from HF `architectures` names to omnistage model classes."""

from __future__ import annotations

from typing import Any

from omnistage.models.base import CausalLM
from omnistage.models.glm_image import GlmImagePrior
from omnistage.models.llama import LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
from omnistage.models.mamba2 import Mamba2ForCausalLM
from omnistage.models.moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM
from omnistage.models.qwen3_next import Qwen3_5ForCausalLM, Qwen3NextForCausalLM
from omnistage.models.qwen3_omni_talker import Qwen3OmniTalker, Qwen3OmniThinker
from omnistage.models.qwen25_omni_talker import Qwen25OmniTalker, Qwen25OmniThinker

_MODELS: dict[str, type[CausalLM]] = {}


def register_model(cls: type[CausalLM]) -> type[CausalLM]:
    for arch in cls.architectures:
        _MODELS[arch] = cls
    return cls


for _cls in (
    LlamaForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
    Qwen2MoeForCausalLM,
    Qwen3MoeForCausalLM,
    Qwen3OmniThinker,
    Qwen3OmniTalker,
    Qwen25OmniThinker,
    Qwen25OmniTalker,
    GlmImagePrior,
    Mamba2ForCausalLM,
    Qwen3NextForCausalLM,
    Qwen3_5ForCausalLM,
):
    register_model(_cls)


def supported_architectures() -> list[str]:
    """HF `architectures` names (internal ones, for parts of omni checkpoints, left out)."""
    return sorted(a for a in _MODELS if not a.startswith("Omnistage"))


def model_class_for(hf_config: Any) -> type[CausalLM]:
    """The class serving this config's `architectures`; ValueError listing the supported ones."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    for arch in archs:
        if arch in _MODELS:
            return _MODELS[arch]
    raise ValueError(
        f"architectures: {archs or 'none given'} is not supported; "
        f"supported: {', '.join(supported_architectures())}"
    )


def engine_config(hf_config: Any) -> Any:
    """The config an engine serves `hf_config`'s checkpoint with: the checkpoint's own, or,
    for a composite checkpoint whose decoder is one of its sub-configs (GLM-Image's prior:
    `text_config`), the view its model class's `engine_config_for` gives."""
    view = getattr(model_class_for(hf_config), "engine_config_for", None)
    return hf_config if view is None else view(hf_config)
