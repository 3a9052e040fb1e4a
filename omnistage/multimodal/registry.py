"""Which input encoder serves a checkpoint, by its `model_type`.

`load_input_encoder(path, dtype)` builds the checkpoint's encoder (what a pipeline's
entry stage runs on prompts with media); `supported_input_modalities` /
`check_input_modalities` say from the config alone what a checkpoint accepts besides
text (what the frontend checks); `render_model_chat` renders chat messages with the
checkpoint's tokenizer and the model's placeholders, without loading any encoder.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from omnistage.models import registry
from omnistage.multimodal.chat import render_chat
from omnistage.multimodal.checkpoint import load_config
from omnistage.multimodal.modalities import check_modalities
from omnistage.multimodal.prompts import ChatPrompt


def input_encoder_class(config_or_path: Any) -> type | None:
    """The `OmniInputEncoder` subclass for a checkpoint (a config or a directory), or None
    for models that take text only."""
    config = load_config(config_or_path)
    return registry.input_encoder_class(getattr(config, "model_type", None))


def load_input_encoder(
    path: str | os.PathLike,
    dtype: torch.dtype | str = torch.float32,
    **kwargs: Any,
) -> Any:
    """The input encoder of the checkpoint at `path` (`from_checkpoint(path, dtype,
    **kwargs)` of its model's encoder class); ValueError for a model without media input."""
    cls = input_encoder_class(path)
    if cls is None:
        config = load_config(path)
        raise ValueError(
            f"{os.fspath(path)}: model_type {getattr(config, 'model_type', None)!r} takes no "
            f"audio or image input (known: {', '.join(registry.input_encoder_model_types())})"
        )
    return cls.from_checkpoint(path, dtype, **kwargs)


def supported_input_modalities(config_or_path: Any) -> frozenset[str]:
    """The input modalities a checkpoint accepts besides text: a subset of {"audio", "image"}.

    From its config (a transformers config or a checkpoint directory): a Qwen3-Omni or
    Qwen2.5-Omni checkpoint whose thinker has an audio encoder accepts audio, one whose
    thinker has a vision encoder accepts images; a generation entry model, what its family
    says it takes itself (`Family.entry_media`: Dynin-Omni's images); any other model
    accepts text only (empty set)."""
    config = load_config(config_or_path)
    cls = input_encoder_class(config)
    if cls is None:
        return registry.entry_media(getattr(config, "model_type", None))
    return cls.supported_modalities(config)


def check_input_modalities(config_or_path: Any, modalities: Iterable[str]) -> None:
    """ValueError naming the first modality the checkpoint does not accept."""
    check_modalities(supported_input_modalities(config_or_path), modalities)


def chat_placeholders(config_or_path: Any) -> dict[str, str]:
    """`{"audio": ..., "image": ...}`: what the model's chat template renders per media
    item (empty for text-only models)."""
    cls = input_encoder_class(config_or_path)
    return {} if cls is None else cls.tokens.placeholders()


def render_model_chat(
    config_or_path: Any,
    tokenizer: Any,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    supported: Iterable[str] | None = None,
) -> ChatPrompt:
    """`render_chat` with the checkpoint's placeholders; `supported` defaults to what the
    checkpoint accepts."""
    config = load_config(config_or_path)
    return render_chat(
        tokenizer,
        messages,
        add_generation_prompt=add_generation_prompt,
        chat_template_kwargs=chat_template_kwargs,
        supported=supported_input_modalities(config) if supported is None else supported,
        placeholders=chat_placeholders(config),
    )
