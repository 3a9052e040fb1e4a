"""The input encoder the omni models share (Qwen3-Omni, Qwen2.5-Omni): `OmniInputEncoder`.

It turns a rendered chat prompt with one placeholder per media item (`<start><pad><end>`
token triples, in order) plus the media into what the thinker decoder consumes
(`EncodedPrompt`): the prompt with each pad repeated to its item's token count, the
thinker's `embed_tokens` rows with the audio tower's / vision encoder's features scattered
at the pads (`masked_scatter`), and the 3-D rotary positions (`mrope_positions`). A
subclass names the model's tokens (`MediaTokens`), its transformers encoder classes, how
its processor pads audio and how many tokens an audio clip takes.

The feature extractor (`WhisperFeatureExtractor`) and the image processor
(`Qwen2VLImageProcessorPil`, the Pillow backend: no torchvision needed) are built from
the checkpoint's processor config; the encoders are transformers' modules with the
checkpoint's `thinker.audio_tower.*` / `thinker.visual.*` weights
(`omnistage.multimodal.checkpoint`). As in the processors, all audios of one prompt go
through the feature extractor together and all images through the image processor and
the vision encoder together. Videos are not supported.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.multimodal.chat import render_chat
from omnistage.multimodal.checkpoint import load_checkpoint_parts
from omnistage.multimodal.media_encoding import encode_audios, encode_images
from omnistage.multimodal.modalities import MediaTokens, thinker_modalities
from omnistage.multimodal.mrope import mrope_positions
from omnistage.multimodal.prompts import ChatPrompt, EncodedPrompt


class OmniInputEncoder:
    """Media + placeholder prompt -> expanded ids, prompt embeddings, mrope positions.

    Subclasses set `model_type`, `model_name`, `tokens` and implement `encoder_classes`,
    `feature_extractor_kwargs`, `audio_token_counts` and `num_audio_tokens`."""

    model_type: ClassVar[str] = ""
    """The checkpoint's `model_type` (`config.json`)."""
    model_name: ClassVar[str] = ""
    tokens: ClassVar[MediaTokens]

    def __init__(
        self,
        hf_config: Any,
        tokenizer: Any,
        embed_tokens: torch.Tensor | Callable[[torch.Tensor], torch.Tensor],
        *,
        audio_tower: torch.nn.Module | None = None,
        visual: torch.nn.Module | None = None,
        feature_extractor: Any = None,
        image_processor: Any = None,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.hf_config = hf_config
        self.thinker_config = hf_config.thinker_config
        self.tokenizer = tokenizer
        self._embed = embed_tokens
        self.audio_tower = audio_tower
        self.visual = visual
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.dtype = dtype
        self.device = torch.device(device)
        tc = self.thinker_config
        self.hidden_size = tc.text_config.hidden_size
        self.audio_token_id = tc.audio_token_id
        self.image_token_id = tc.image_token_id
        self.video_token_id = tc.video_token_id
        self.spatial_merge_size = (
            tc.vision_config.spatial_merge_size if tc.vision_config is not None else 2
        )
        self.position_id_per_seconds = tc.position_id_per_seconds
        self.modalities = frozenset(
            m
            for m, parts in (
                ("audio", (audio_tower, feature_extractor)),
                ("image", (visual, image_processor)),
            )
            if all(p is not None for p in parts)
        )
        # Marker ids from the tokenizer, cross-checked with the ids the model scatters at.
        t = self.tokens
        ids = {tok: tokenizer.convert_tokens_to_ids(tok) for tok in t.audio + t.image}
        for tok, cfg_id in (
            (t.audio[1], tc.audio_token_id),
            (t.image[1], tc.image_token_id),
            (t.audio[0], tc.audio_start_token_id),
            (t.image[0], tc.vision_start_token_id),
        ):
            if ids[tok] != cfg_id:
                raise ValueError(
                    f"tokenizer: {tok} is id {ids[tok]} but the model config says {cfg_id}"
                )
        self.marker_ids = {
            "audio": tuple(ids[tok] for tok in t.audio),
            "image": tuple(ids[tok] for tok in t.image),
        }

    # -- model specifics (subclasses) ----------------------------------------------------
    @classmethod
    def encoder_classes(cls) -> tuple[type, type]:
        """(audio tower class, vision encoder class) of transformers."""
        raise NotImplementedError

    def feature_extractor_kwargs(self, num_samples: list[int]) -> dict[str, Any]:
        """How the feature extractor pads (and truncates) a prompt's clips of `num_samples`
        samples together, so that their valid mel frames are the model processor's."""
        raise NotImplementedError

    def audio_token_counts(self, mel_frames: torch.Tensor) -> list[int]:
        """Audio tokens per clip of `mel_frames` valid feature frames (the processor's)."""
        raise NotImplementedError

    def num_audio_tokens(self, num_samples: int) -> int:
        """Placeholder tokens for a clip of `num_samples` samples at `sampling_rate`."""
        raise NotImplementedError

    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        """What a checkpoint of this model accepts besides text (from its config)."""
        if getattr(config, "model_type", None) != cls.model_type:
            return frozenset()
        return thinker_modalities(config)

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_checkpoint(
        cls,
        path: str | os.PathLike,
        dtype: torch.dtype | str = torch.float32,
        *,
        device: str | torch.device = "cpu",
        modalities: Iterable[str] | None = None,
        embed_tokens: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> OmniInputEncoder:
        """Load the encoders of `modalities` (default: every one the checkpoint supports), the
        processors and (unless `embed_tokens` is given, e.g. the serving model's embedding
        function) the thinker's `embed_tokens` weight from a checkpoint of this model."""
        parts = load_checkpoint_parts(
            cls,
            path,
            dtype,
            device=device,
            modalities=modalities,
            embed_tokens=embed_tokens,
        )
        return cls(
            parts.hf_config,
            parts.tokenizer,
            parts.embed_tokens,
            audio_tower=parts.audio_tower,
            visual=parts.visual,
            feature_extractor=parts.feature_extractor,
            image_processor=parts.image_processor,
            dtype=parts.dtype,
            device=device,
        )

    # -- sizes ---------------------------------------------------------------------------
    @property
    def sampling_rate(self) -> int:
        """The audio rate the feature extractor expects (16 kHz for the Qwen omni models)."""
        if self.feature_extractor is None:
            return 16000
        return int(self.feature_extractor.sampling_rate)

    @property
    def hop_length(self) -> int:
        fe = self.feature_extractor
        return int(fe.hop_length) if fe is not None else 160

    # -- chat ----------------------------------------------------------------------------
    def render_chat(
        self,
        messages: list[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatPrompt:
        """Render OpenAI-style messages with the checkpoint's chat template.

        Content parts: `{"type": "text", "text": ...}`; audio as `{"type": "audio", "audio":
        path | bytes | array | (array, rate)}` (an array also needs `"sampling_rate"`),
        `{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav"}}` or
        `{"type": "audio_url", "audio_url": {"url": ...}}`; images as `{"type": "image",
        "image": path | bytes | PIL image | array}` or `{"type": "image_url", "image_url":
        {"url": ...}}`. URLs may be local paths, `file://` or base64 `data:` URLs.
        """
        return render_chat(
            self.tokenizer,
            messages,
            add_generation_prompt=add_generation_prompt,
            chat_template_kwargs=chat_template_kwargs,
            supported=self.modalities,
            placeholders=self.tokens.placeholders(),
        )

    def encode_chat(
        self,
        messages: list[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> EncodedPrompt:
        chat = self.render_chat(messages, add_generation_prompt, chat_template_kwargs)
        return self.encode(chat.prompt, audios=chat.audios, images=chat.images)

    # -- encoding ------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        """Token ids of a rendered prompt (before expansion; no BOS/EOS added)."""
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
        return list(self.tokenizer.encode(prompt, add_special_tokens=False))

    def _placeholder_slots(self, ids: list[int], modality: str) -> list[int]:
        """Indices of the placeholder pads of `modality`, each checked to sit in its triple."""
        start, pad, end = self.marker_ids[modality]
        message = (
            f"prompt: each {modality} placeholder must be exactly "
            f"{self.tokens.placeholder(modality)!r}"
        )
        slots = []
        for i, tok in enumerate(ids):
            if tok == pad:
                if not (0 < i < len(ids) - 1 and ids[i - 1] == start and ids[i + 1] == end):
                    raise ValueError(message)
                slots.append(i)
            elif tok == start and not (i + 1 < len(ids) and ids[i + 1] == pad):
                raise ValueError(message)
        return slots

    @torch.no_grad()
    def encode(
        self,
        prompt: str | Sequence[int],
        audios: Sequence[Any] = (),
        images: Sequence[Any] = (),
    ) -> EncodedPrompt:
        """Expand the placeholders of `prompt` (a rendered string or its token ids) for
        `audios` and `images` (in placeholder order; anything `load_audio` / `load_image`
        accept), run the encoders and build the prompt embeddings and positions."""
        audios, images = list(audios), list(images)
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if self.video_token_id in ids:
            raise ValueError("prompt: video input is not supported")
        audio_slots = self._placeholder_slots(ids, "audio")
        image_slots = self._placeholder_slots(ids, "image")
        for modality, slots, items in (
            ("audio", audio_slots, audios),
            ("image", image_slots, images),
        ):
            if len(slots) != len(items):
                raise ValueError(
                    f"prompt: {len(slots)} {modality} placeholder(s) but {len(items)} {modality} "
                    "input(s) given"
                )
            if items and modality not in self.modalities:
                raise ValueError(f"{modality}: this encoder was not loaded for {modality} input")

        audio_features, audio_counts = encode_audios(self, audios)
        image_features, deepstack, grid_thw = encode_images(self, images)
        image_counts = (grid_thw.prod(-1) // self.spatial_merge_size**2).tolist()

        counts = {i: n for i, n in zip(audio_slots, audio_counts, strict=True)}
        counts.update(zip(image_slots, image_counts, strict=True))
        expanded: list[int] = []
        for i, tok in enumerate(ids):
            expanded.extend([tok] * counts[i] if i in counts else [tok])

        ids_t = torch.tensor(expanded, dtype=torch.long, device=self.device)
        embeds = self._embed_ids(ids_t)
        audio_mask = ids_t == self.audio_token_id
        visual_mask = ids_t == self.image_token_id
        if audio_features is not None:
            embeds[audio_mask] = audio_features.to(embeds.dtype)
        if image_features is not None:
            embeds[visual_mask] = image_features.to(embeds.dtype)
        positions, delta = mrope_positions(
            expanded,
            grid_thw,
            image_token_id=self.image_token_id,
            spatial_merge_size=self.spatial_merge_size,
            position_id_per_seconds=self.position_id_per_seconds,
        )
        return EncodedPrompt(
            prompt_token_ids=expanded,
            prompt_embeds=embeds,
            mrope_positions=positions,
            rope_delta=int(delta),
            audio_mask=audio_mask,
            visual_pos_mask=visual_mask,
            deepstack_embeds=[d.to(embeds.dtype) for d in deepstack],
            audio_token_counts=[int(n) for n in audio_counts],
            image_grid_thw=grid_thw,
        )

    def _embed_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self._embed, torch.Tensor):
            if int(ids.max()) >= self._embed.shape[0] or int(ids.min()) < 0:
                raise ValueError("prompt: token id outside the vocabulary")
            return self._embed[ids].clone()
        out = self._embed(ids)
        return out.to(self.dtype).clone()

    def audio_features(self, audios: Sequence[Any]) -> tuple[list[torch.Tensor], list[int]]:
        """Per clip `[tokens, hidden]` audio-tower features (clips processed together)."""
        features, counts = encode_audios(self, list(audios))
        if features is None:
            return [], []
        return list(features.split(counts)), counts

    def mel_features(self, waves: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """`([mel, total frames], [clips] frames)`: the valid log-mel frames of every clip
        (mono float at `sampling_rate`) side by side, as `get_audio_features` selects them
        from the processor's padded `input_features`, and each clip's frame count."""
        inputs = self.feature_extractor(
            list(waves),
            sampling_rate=self.sampling_rate,
            **self.feature_extractor_kwargs([len(w) for w in waves]),
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = inputs["attention_mask"].bool()
        features = inputs["input_features"].permute(0, 2, 1)[mask].permute(1, 0)
        return features, mask.sum(-1)

    def image_features(
        self, images: Sequence[Any]
    ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]], torch.Tensor]:
        """Per image `[tokens, hidden]` merged features, per deepstack layer the per-image
        deepstack features (none for models without deepstack), and the `[n, 3]` grids
        (images processed together)."""
        features, deepstack, grid = encode_images(self, list(images))
        if features is None:
            return [], [], grid
        sizes = (grid.prod(-1) // self.spatial_merge_size**2).tolist()
        return list(features.split(sizes)), [list(d.split(sizes)) for d in deepstack], grid
