"""Audio and image input for the Qwen3-Omni thinker, as transformers 5.23 prepares it.

`Qwen3OmniInputEncoder` turns a rendered chat prompt with one placeholder per
media item (`<|audio_start|><|audio_pad|><|audio_end|>`,
`<|vision_start|><|image_pad|><|vision_end|>`, in order) plus the media into what
the thinker decoder consumes:

- `prompt_token_ids`: the prompt with each `<|audio_pad|>` / `<|image_pad|>`
  repeated to its item's token count, as `Qwen3OmniMoeProcessor` expands it
  (audio: `_get_feat_extract_output_lengths(mel_frames, n_window)`; image:
  `t * h * w / merge_size**2` of its patch grid);
- `prompt_embeds` `[L, hidden]`: the thinker's `embed_tokens` rows, with the audio
  tower's features at the audio positions and the vision encoder's merged features
  at the image positions (`Qwen3OmniMoeThinkerModel.forward`'s `masked_scatter`);
- `mrope_positions` `[3, L]` and `rope_delta`, as
  `Qwen3OmniMoeThinkerForConditionalGeneration.get_rope_index` computes them
  (all three rows `0..L-1` and delta 0 without images; with images the image
  tokens get (t, h, w) grid positions and what follows continues at `max + 1`;
  generated token `i` (0-based over the whole sequence) has position
  `i + rope_delta` in all three rows);
- "deepstack" (images only): `deepstack_embeds[k]` (`[n_visual, hidden]`, from the
  vision encoder's `merger_list[k]`) must be **added to the hidden states at the
  positions of `visual_pos_mask` after decoder layer `k`**, for
  `k < len(deepstack_embeds)` (`Qwen3OmniMoeThinkerTextModel._deepstack_process`).

`LLMEngine.add_encoded_request` runs an `EncodedPrompt` on the thinker decoder: its ids,
embeddings and (`MultimodalDecoderInputs.from_encoded_prompt`) its 3-D positions and
deepstack features.

The feature extractor (`WhisperFeatureExtractor`) and the image processor
(`Qwen2VLImageProcessorPil`, the Pillow backend: no torchvision needed) are
built from the checkpoint's processor config; the audio tower
(`Qwen3OmniMoeAudioEncoder`) and vision encoder (`Qwen3OmniMoeVisionEncoder`)
are transformers' modules with the checkpoint's `thinker.audio_tower.*` /
`thinker.visual.*` weights. As in the processor, all audios of one prompt go
through the feature extractor together (padded to the longest, not truncated) and
all images through the image processor and the vision encoder together. Videos are
not supported. What this shares with Qwen2.5-Omni's encoder lives in
`omnistage.multimodal.input_encoder`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from omnistage.multimodal.chat import render_chat as _render_chat
from omnistage.multimodal.input_encoder import OmniInputEncoder
from omnistage.multimodal.modalities import MODALITIES, MediaTokens
from omnistage.multimodal.mrope import mrope_positions
from omnistage.multimodal.prompts import ChatPrompt, EncodedPrompt
from omnistage.multimodal.registry import check_input_modalities, supported_input_modalities

TOKENS = MediaTokens(
    audio=("<|audio_start|>", "<|audio_pad|>", "<|audio_end|>"),
    image=("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"),
)
AUDIO_PLACEHOLDER = TOKENS.placeholder("audio")
IMAGE_PLACEHOLDER = TOKENS.placeholder("image")

__all__ = [
    "AUDIO_PLACEHOLDER",
    "IMAGE_PLACEHOLDER",
    "MODALITIES",
    "ChatPrompt",
    "EncodedPrompt",
    "Qwen3OmniInputEncoder",
    "audio_output_lengths",
    "check_input_modalities",
    "mrope_positions",
    "render_chat",
    "supported_input_modalities",
]


def audio_output_lengths(mel_frames: torch.Tensor | int, n_window: int = 50):
    """Audio-tower tokens per clip of `mel_frames` feature frames (transformers'
    `_get_feat_extract_output_lengths`: 100 mel frames per second, 13 tokens per 100 frames)."""
    chunk_len = n_window * 2
    leave = mel_frames % chunk_len
    feat_lengths = (leave - 1) // 2 + 1
    return ((feat_lengths - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // chunk_len) * 13


class Qwen3OmniInputEncoder(OmniInputEncoder):
    """Media + placeholder prompt -> expanded ids, prompt embeddings, mrope positions,
    deepstack features (see the module docstring)."""

    model_type = "qwen3_omni_moe"
    model_name = "Qwen3-Omni"
    tokens = TOKENS

    def __init__(self, hf_config: Any, tokenizer: Any, embed_tokens: Any, **kwargs: Any) -> None:
        super().__init__(hf_config, tokenizer, embed_tokens, **kwargs)
        audio = self.thinker_config.audio_config
        self.n_window = audio.n_window if audio is not None else 50

    @classmethod
    def encoder_classes(cls) -> tuple[type, type]:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeAudioEncoder,
            Qwen3OmniMoeVisionEncoder,
        )

        return Qwen3OmniMoeAudioEncoder, Qwen3OmniMoeVisionEncoder

    def feature_extractor_kwargs(self, num_samples: list[int]) -> dict[str, Any]:
        """`Qwen3OmniMoeProcessor`'s: padded to the longest clip, not truncated."""
        return {"padding": True, "truncation": False}

    def audio_token_counts(self, mel_frames: torch.Tensor) -> list[int]:
        return [int(n) for n in audio_output_lengths(mel_frames, self.n_window)]

    def num_audio_tokens(self, num_samples: int) -> int:
        """Placeholder tokens for a clip of `num_samples` samples at `sampling_rate`, alone in
        its prompt (the processor's `_get_num_audio_tokens`)."""
        return int(audio_output_lengths(int(num_samples) // self.hop_length, self.n_window))


def render_chat(
    tokenizer: Any,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    supported: Iterable[str] = MODALITIES,
) -> ChatPrompt:
    """Render messages with `tokenizer`'s chat template (Qwen3-Omni placeholders): one
    placeholder per audio / image content part; returns the prompt and the media sources
    in placeholder order. `omnistage.multimodal.render_model_chat` picks the placeholders
    of any supported checkpoint."""
    return _render_chat(
        tokenizer,
        messages,
        add_generation_prompt=add_generation_prompt,
        chat_template_kwargs=chat_template_kwargs,
        supported=supported,
        placeholders=TOKENS.placeholders(),
    )
