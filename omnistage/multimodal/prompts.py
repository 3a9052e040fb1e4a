"""What the input encoders hand on: a chat rendered with its media in placeholder order
(`ChatPrompt`), and everything the thinker decoder needs for one multimodal prompt
(`EncodedPrompt`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class ChatPrompt:
    """A chat rendered with the model's template, and its media in placeholder order."""

    prompt: str
    audios: list[Any] = field(default_factory=list)
    """Each a path, file bytes or `(samples, sampling_rate)`: what `load_audio` accepts."""
    images: list[Any] = field(default_factory=list)
    """Each a path, file bytes, PIL image or uint8 array: what `load_image` accepts."""


@dataclass
class EncodedPrompt:
    """Everything the thinker decoder needs for one multimodal prompt."""

    prompt_token_ids: list[int]
    """The expanded prompt ids (placeholders repeated to their token counts)."""
    prompt_embeds: torch.Tensor
    """`[L, hidden]`: token embeddings with the encoders' features scattered in."""
    mrope_positions: torch.Tensor
    """`[3, L]` int64 (T, H, W) rotary positions of the prompt (`get_rope_index`)."""
    rope_delta: int
    """Position of generated token `i` (0-based over prompt + output) = `i + rope_delta`."""
    audio_mask: torch.Tensor
    """`[L]` bool: audio-feature positions."""
    visual_pos_mask: torch.Tensor
    """`[L]` bool: image-feature positions (where deepstack features are added)."""
    deepstack_embeds: list[torch.Tensor]
    """Per decoder layer `k` (0, 1, ...): `[visual_pos_mask.sum(), hidden]` features added to
    the hidden states at `visual_pos_mask` after decoder layer `k`. Empty without images,
    and always for models without deepstack (Qwen2.5-Omni)."""
    audio_token_counts: list[int]
    image_grid_thw: torch.Tensor
    """`[num_images, 3]` int64 patch grids (t, h, w) from the image processor."""
    token_modality: torch.Tensor | None = None
    """`[L]` int64 per-token modality codes for models that route by them (Ming-Omni;
    `core/multimodal_inputs.py`); None: the decoder tells no modality apart."""

    @classmethod
    def audio_only(
        cls,
        prompt_token_ids: list[int],
        prompt_embeds: torch.Tensor,
        audio_mask: torch.Tensor,
        audio_token_counts: list[int],
    ) -> EncodedPrompt:
        """A prompt whose only media are audio clips, at plain positions `0..L-1` (no
        images, no 3-D positions): what a model without M-RoPE encodes."""
        return cls(
            prompt_token_ids=prompt_token_ids,
            prompt_embeds=prompt_embeds,
            mrope_positions=torch.arange(len(prompt_token_ids)).expand(3, -1).clone(),
            rope_delta=0,
            audio_mask=audio_mask,
            visual_pos_mask=torch.zeros_like(audio_mask),
            deepstack_embeds=[],
            audio_token_counts=audio_token_counts,
            image_grid_thw=torch.zeros(0, 3, dtype=torch.long),
        )

    @property
    def uses_mrope(self) -> bool:
        """True when the positions are not plain `0..L-1` (the prompt has images)."""
        return bool(len(self.image_grid_thw))
