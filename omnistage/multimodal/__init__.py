"""Multimodal (audio, image) input: media loading and per-model input encoders."""

from omnistage.multimodal.media import load_audio, load_image, resample_audio
from omnistage.multimodal.qwen3_omni import (
    ChatPrompt,
    EncodedPrompt,
    Qwen3OmniInputEncoder,
    check_input_modalities,
    mrope_positions,
    render_chat,
    supported_input_modalities,
)

__all__ = [
    "ChatPrompt",
    "EncodedPrompt",
    "Qwen3OmniInputEncoder",
    "check_input_modalities",
    "load_audio",
    "load_image",
    "mrope_positions",
    "render_chat",
    "resample_audio",
    "supported_input_modalities",
]
