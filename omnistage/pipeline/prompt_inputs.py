"""A pipeline request's prompt, read and checked in the frontend before any stage runs.

A prompt is one of:

- a string (sent as is; omni models expect their chat format);
- `{"prompt": str}` or `{"prompt_token_ids": [...]}` (optionally both), with optional
  `"multi_modal_data": {"audio": item | [items], "image": item | [items]}`, one item per
  placeholder of the prompt, in order (as vLLM takes them);
- `{"messages": [...]}`: OpenAI-style chat messages, rendered with the entry model's
  chat template (and the optional `"chat_template_kwargs"`, e.g. HunyuanImage-3's
  `bot_task`; a value the template refuses is a ValueError naming it) by
  `multimodal.request_chat.render_request_chat`, as the server renders a chat; content
  parts may be text, audio (`{"type": "audio", "audio": ...}`, `input_audio`,
  `audio_url`) and image (`image`, `image_url`).

Audio items are file paths, file bytes, or `(samples, sampling_rate)`; images are file
paths, file bytes, PIL images or uint8 arrays. The frontend decodes them here (and
resamples audio to the rate the model's feature extractor takes), so an unsupported
modality, an undecodable file or an impossible sample rate is a `ValueError` naming the
problem before the request reaches a stage. The entry stage then runs the model's own
processor and encoders on the decoded media.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

AUDIO_RATE = 16000
"""The rate of the Whisper-style feature extractors of the omni models we serve."""
MIN_AUDIO_SAMPLES = 321
"""The shortest clip every omni encoder we serve turns into at least one audio token: the
STFT (n_fft 400, reflect-padded) needs n_fft / 2 + 1 samples, and Qwen2.5-Omni's audio
encoder needs 3 mel frames (hop 160)."""


@dataclass
class PromptInputs:
    prompt: str | None
    prompt_token_ids: list[int] | None
    audios: list[np.ndarray] = field(default_factory=list)
    """float32 mono at `AUDIO_RATE`."""
    images: list[np.ndarray] = field(default_factory=list)
    """uint8 [H, W] or [H, W, C] (C = 3, or 4 with alpha), as decoded."""


class PromptReader:
    """Reads prompts for a pipeline whose entry stage runs `model` (a name or a path)."""

    def __init__(self, model: str | None) -> None:
        self.model = model

    @functools.cached_property
    def _path(self) -> Any:
        from omnistage.models.loader import resolve_model

        return resolve_model(self.model).path

    @functools.cached_property
    def input_modalities(self) -> frozenset[str]:
        """What the entry model takes besides text."""
        from omnistage.multimodal.registry import supported_input_modalities

        if self.model is None:
            return frozenset()
        return supported_input_modalities(self._path)

    @functools.cached_property
    def renders_own_prompt(self) -> bool:
        """Whether the entry model renders its own prompt (Bagel): chats reach it as the
        last user message's text, not through a chat template."""
        from omnistage.models import registry
        from omnistage.pipeline.deploy import model_type_of

        return self.model is not None and registry.renders_own_prompt(model_type_of(self.model))

    def read(self, prompt: Any) -> PromptInputs:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt: the prompt is empty")
            return PromptInputs(prompt, None)
        if not isinstance(prompt, Mapping):
            raise ValueError(
                "prompt: expected a string or a dict with 'prompt' / 'prompt_token_ids' / "
                f"'messages', got {type(prompt).__name__}"
            )
        unknown = sorted(
            set(prompt)
            - {"prompt", "prompt_token_ids", "multi_modal_data", "messages", "chat_template_kwargs"}
        )
        if unknown:
            raise ValueError(f"prompt: unknown field {unknown[0]!r}")
        if "messages" in prompt:
            if set(prompt) - {"messages", "chat_template_kwargs"}:
                raise ValueError("messages: give either 'messages' or a 'prompt', not both")
            return self._read_messages(prompt["messages"], prompt.get("chat_template_kwargs"))
        if "chat_template_kwargs" in prompt:
            raise ValueError("chat_template_kwargs: only with 'messages'")
        text, ids = _text_and_ids(prompt)
        media = prompt.get("multi_modal_data") or {}
        if not isinstance(media, Mapping):
            raise ValueError("multi_modal_data: expected a dict {'audio': ..., 'image': ...}")
        for key in media:
            if key not in ("audio", "image"):
                raise ValueError(f"multi_modal_data: unsupported modality {key!r}")
        return PromptInputs(
            text,
            ids,
            self._audios(_as_list(media.get("audio"))),
            self._images(_as_list(media.get("image"))),
        )

    def _read_messages(self, messages: Any, template_kwargs: Any = None) -> PromptInputs:
        from omnistage.models.loader import load_tokenizer, resolve_model
        from omnistage.multimodal.request_chat import render_request_chat

        own = self.renders_own_prompt  # its prompter wraps the text: no chat template
        chat = render_request_chat(
            None if own else load_tokenizer(resolve_model(self.model)),
            messages,
            chat_template_kwargs=template_kwargs,
            own_prompt=own,
            config=self._path,
            supported=self.input_modalities,
        )
        audios = [] if own else self._audios(chat.audios)
        return PromptInputs(chat.prompt, None, audios, self._images(chat.images))

    def _check(self, modality: str) -> None:
        if modality not in self.input_modalities:
            accepted = ", ".join(sorted(self.input_modalities)) or "text only"
            raise ValueError(
                f"{modality}: this model does not accept {modality} input (it takes {accepted})"
            )

    def _audios(self, items: list[Any]) -> list[np.ndarray]:
        from omnistage.multimodal.media import load_audio

        if items:
            self._check("audio")
        clips = [load_audio(item, target_rate=AUDIO_RATE) for item in items]
        for i, clip in enumerate(clips):
            if clip.size < MIN_AUDIO_SAMPLES:
                raise ValueError(
                    f"audio {i}: too short ({clip.size} samples at {AUDIO_RATE} Hz; at least "
                    f"{MIN_AUDIO_SAMPLES} are needed)"
                )
        return clips

    def _images(self, items: list[Any]) -> list[np.ndarray]:
        from omnistage.multimodal.media import load_image

        if items:
            self._check("image")
        out = []
        for item in items:
            image = load_image(item)
            if image.mode not in ("L", "RGB", "RGBA"):
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            out.append(np.array(image, dtype=np.uint8))  # a writable copy (torch.from_numpy)
        return out


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _text_and_ids(prompt: Mapping[str, Any]) -> tuple[str | None, list[int] | None]:
    ids = prompt.get("prompt_token_ids")
    if ids is not None:
        if (
            not isinstance(ids, list | tuple)
            or not ids
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
        ):
            raise ValueError("prompt_token_ids: must be a non-empty list of integers")
        return prompt.get("prompt"), list(ids)
    text = prompt.get("prompt")
    if not isinstance(text, str) or not text:
        raise ValueError("prompt: expected a non-empty string 'prompt' or 'prompt_token_ids'")
    return text, None
