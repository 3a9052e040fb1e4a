"""Multimodal (audio, image) input: media loading, chat rendering and the input-encoder
base; each family's encoder lives in its folder (`omnistage/families/<family>/`)."""

from omnistage.multimodal.chat import render_chat
from omnistage.multimodal.input_encoder import OmniInputEncoder
from omnistage.multimodal.media import load_audio, load_image, resample_audio
from omnistage.multimodal.mrope import mrope_positions
from omnistage.multimodal.prompts import ChatPrompt, EncodedPrompt
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
