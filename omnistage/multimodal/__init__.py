"""Multimodal (audio, image) input: media loading and per-model input encoders."""

from omnistage.multimodal.input_encoder import OmniInputEncoder
from omnistage.multimodal.media import load_audio, load_image, resample_audio
from omnistage.multimodal.prompts import ChatPrompt, EncodedPrompt
from omnistage.multimodal.qwen3_omni import (
    Qwen3OmniInputEncoder,
    mrope_positions,
    render_chat,
)
from omnistage.multimodal.qwen25_omni import Qwen25OmniInputEncoder
from omnistage.multimodal.registry import (
    check_input_modalities,
    input_encoder_class,
    load_input_encoder,
    render_model_chat,
    supported_input_modalities,
)

__all__ = [
    "ChatPrompt",
    "EncodedPrompt",
    "OmniInputEncoder",
    "Qwen25OmniInputEncoder",
    "Qwen3OmniInputEncoder",
    "check_input_modalities",
    "input_encoder_class",
    "load_audio",
    "load_image",
    "load_input_encoder",
    "mrope_positions",
    "render_chat",
    "render_model_chat",
    "resample_audio",
    "supported_input_modalities",
]
