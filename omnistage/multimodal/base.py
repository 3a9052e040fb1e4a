"""What the omni models' input encoders share (Qwen3-Omni, Qwen2.5-Omni).

`OmniInputEncoder` turns a rendered chat prompt with one placeholder per media item
(`<start><pad><end>` token triples, in order) plus the media into what the thinker
decoder consumes (`EncodedPrompt`): the prompt with each pad repeated to its item's
token count, the thinker's `embed_tokens` rows with the audio tower's / vision
encoder's features scattered at the pads (`masked_scatter`), and the 3-D rotary
positions (`mrope_positions`). A subclass names the model's tokens (`MediaTokens`),
its transformers encoder classes, how its processor pads audio and how many tokens
an audio clip takes.

The feature extractor (`WhisperFeatureExtractor`) and the image processor
(`Qwen2VLImageProcessorPil`, the Pillow backend: no torchvision needed) are built from
the checkpoint's processor config; the encoders are transformers' modules with the
checkpoint's `thinker.audio_tower.*` / `thinker.visual.*` weights. As in the
processors, all audios of one prompt go through the feature extractor together and all
images through the image processor and the vision encoder together. Videos are not
supported.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.multimodal.media import load_audio, load_image, resolve_url

MODALITIES = ("audio", "image")


@dataclass(frozen=True)
class MediaTokens:
    """A model's placeholder tokens: (start, pad, end) per modality."""

    audio: tuple[str, str, str]
    image: tuple[str, str, str]

    def placeholder(self, modality: str) -> str:
        """The string a chat template renders for one item of `modality`."""
        return "".join(getattr(self, modality))

    def placeholders(self) -> dict[str, str]:
        return {m: self.placeholder(m) for m in MODALITIES}


# -- configs, modalities ----------------------------------------------------------------


def load_config(config_or_path: Any) -> Any:
    """A transformers config, or the one of a checkpoint directory (ValueError if none)."""
    if isinstance(config_or_path, (str, os.PathLike)):
        import transformers

        try:
            return transformers.AutoConfig.from_pretrained(
                os.fspath(config_or_path), local_files_only=True
            )
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{config_or_path}: cannot load the config ({e})") from e
    return config_or_path


def thinker_modalities(config: Any) -> frozenset[str]:
    """What an omni config's thinker accepts besides text: audio if it has an audio
    encoder and an audio token, images if it has a vision encoder and an image token."""
    thinker = getattr(config, "thinker_config", None)
    if thinker is None:
        return frozenset()
    found = set()
    if getattr(thinker, "audio_config", None) is not None and thinker.audio_token_id is not None:
        found.add("audio")
    if getattr(thinker, "vision_config", None) is not None and thinker.image_token_id is not None:
        found.add("image")
    return frozenset(found)


def check_modalities(supported: Iterable[str], modalities: Iterable[str]) -> None:
    """ValueError naming the first of `modalities` not in `supported`."""
    supported = frozenset(supported)
    for modality in modalities:
        if modality not in supported:
            accepted = ", ".join(sorted(supported)) or "none"
            raise ValueError(
                f"{modality}: this model does not accept {modality} input "
                f"(accepted besides text: {accepted})"
            )


# -- positions ---------------------------------------------------------------------------


def mrope_positions(
    input_ids: Sequence[int] | torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int,
    position_id_per_seconds: float,
) -> tuple[torch.Tensor, int]:
    """`([3, L] int64 positions, rope_delta)` as `get_rope_index` computes them for one
    unpadded sequence of text, audio and image tokens (no videos), in Qwen3-Omni and in
    Qwen2.5-Omni alike.

    Text and audio tokens (and the start/end markers) take the next position in all three
    rows. The `t*h*w / m**2` tokens of image `k` (its grid `image_grid_thw[k]`) take
    `(next + t_i * position_id_per_seconds, next + h_i, next + w_i)` over its merged grid
    in (t, h, w) order; the token after it continues at the block's maximum + 1.
    `rope_delta = max + 1 - L` (0 without images).
    """
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
    length = ids.numel()
    if image_grid_thw is None or len(image_grid_thw) == 0:
        return torch.arange(length).expand(3, length).clone(), 0
    grids = torch.as_tensor(image_grid_thw, dtype=torch.long).reshape(-1, 3).tolist()
    positions = torch.empty(3, length, dtype=torch.long)
    is_image = (ids == image_token_id).tolist()
    nxt, i, image = 0, 0, 0
    while i < length:
        if not is_image[i]:
            positions[:, i] = nxt
            nxt += 1
            i += 1
            continue
        if image >= len(grids):
            raise ValueError("prompt: more image tokens than image grids")
        t, h, w = grids[image]
        gh, gw = h // spatial_merge_size, w // spatial_merge_size
        n = t * gh * gw
        if i + n > length or not all(is_image[i : i + n]):
            raise ValueError(f"prompt: image {image} needs {n} consecutive image tokens")
        t_index = torch.arange(t, dtype=torch.float64) * float(position_id_per_seconds)
        if not torch.equal(t_index, t_index.round()):
            raise ValueError("position_id_per_seconds: gives non-integer temporal positions")
        block = torch.stack(
            [
                t_index.long().view(-1, 1, 1).expand(t, gh, gw),
                torch.arange(gh).view(1, -1, 1).expand(t, gh, gw),
                torch.arange(gw).view(1, 1, -1).expand(t, gh, gw),
            ]
        ).reshape(3, n)
        positions[:, i : i + n] = block + nxt
        nxt = int(positions[:, i : i + n].max()) + 1
        i += n
        image += 1
    if image != len(grids):
        raise ValueError(f"prompt: {image} image blocks for {len(grids)} image grids")
    return positions, nxt - length


# -- results -----------------------------------------------------------------------------


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

    @property
    def uses_mrope(self) -> bool:
        """True when the positions are not plain `0..L-1` (the prompt has images)."""
        return bool(len(self.image_grid_thw))


# -- checkpoint files --------------------------------------------------------------------


def processor_configs(path: Path) -> tuple[dict | None, dict | None]:
    """(feature-extractor config, image-processor config) of a checkpoint directory.

    transformers 5 writes `processor_config.json` with one entry per sub-processor; older
    checkpoints (the Hub's Qwen3-Omni) keep a flat `preprocessor_config.json` holding both.
    """
    feature, image = None, None
    nested = path / "processor_config.json"
    if nested.is_file():
        try:
            data = json.loads(nested.read_text())
        except ValueError as e:
            raise ValueError(f"{nested}: not valid JSON ({e})") from e
        if isinstance(data.get("feature_extractor"), dict):
            feature = data["feature_extractor"]
        if isinstance(data.get("image_processor"), dict):
            image = data["image_processor"]
    flat = path / "preprocessor_config.json"
    if (feature is None or image is None) and flat.is_file():
        try:
            data = json.loads(flat.read_text())
        except ValueError as e:
            raise ValueError(f"{flat}: not valid JSON ({e})") from e
        if feature is None and "feature_extractor_type" in data:
            feature = data
        if image is None and ("image_processor_type" in data or "patch_size" in data):
            image = data
    return feature, image


def read_weights(path: Path, prefixes: Sequence[str]) -> dict[str, dict[str, torch.Tensor]]:
    """`{prefix: {name without prefix: tensor}}` for the checkpoint's tensors under `prefixes`."""
    from omnistage.models.loader import iter_weights

    out: dict[str, dict[str, torch.Tensor]] = {p: {} for p in prefixes}
    for key, tensor in iter_weights(path, prefixes):
        prefix = next(p for p in prefixes if key.startswith(p))
        out[prefix][key[len(prefix) :]] = tensor
    return out


def build_module(cls: Any, config: Any, weights: dict[str, torch.Tensor], dtype, device, what):
    """A transformers module of `cls` from `config` with exactly `weights`, frozen."""
    from transformers.initialization import no_init_weights

    if not weights:
        raise ValueError(f"checkpoint: no {what} weights")
    with no_init_weights():
        module = cls._from_config(copy.deepcopy(config), dtype=dtype)
    try:
        module.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise ValueError(f"checkpoint: {what} weights do not fit the config ({e})") from e
    return module.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"dtype: unknown dtype {dtype!r}")
        return resolved
    return dtype


# -- the encoder -------------------------------------------------------------------------


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
        from transformers import WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        from omnistage.models.loader import load_hf_config, load_tokenizer, resolve_model

        dtype = _as_dtype(dtype)
        files = resolve_model(os.fspath(path))
        hf_config = load_hf_config(files)
        if getattr(hf_config, "model_type", None) != cls.model_type:
            raise ValueError(
                f"{files.path}: not a {cls.model_name} checkpoint "
                f"(model_type {getattr(hf_config, 'model_type', None)!r})"
            )
        supported = cls.supported_modalities(hf_config)
        wanted = set(supported if modalities is None else modalities)
        check_modalities(supported, wanted)
        audio_cls, vision_cls = cls.encoder_classes()
        tokenizer = load_tokenizer(files)
        fe_config, ip_config = processor_configs(files.path)
        prefixes = []
        if "audio" in wanted:
            prefixes.append("thinker.audio_tower.")
        if "image" in wanted:
            prefixes.append("thinker.visual.")
        if embed_tokens is None:
            prefixes.append("thinker.model.embed_tokens.")
        weights = read_weights(files.path, prefixes)
        tc = hf_config.thinker_config
        audio_tower = visual = feature_extractor = image_processor = None
        if "audio" in wanted:
            if fe_config is None:
                raise ValueError(
                    f"{files.path}: no feature-extractor config (processor_config.json or "
                    "preprocessor_config.json) for audio input"
                )
            feature_extractor = WhisperFeatureExtractor.from_dict(dict(fe_config))
            audio_tower = build_module(
                audio_cls,
                tc.audio_config,
                weights["thinker.audio_tower."],
                dtype,
                device,
                "audio tower (thinker.audio_tower.*)",
            )
        if "image" in wanted:
            if ip_config is None:
                raise ValueError(
                    f"{files.path}: no image-processor config (processor_config.json or "
                    "preprocessor_config.json) for image input"
                )
            image_processor = Qwen2VLImageProcessorPil.from_dict(dict(ip_config))
            visual = build_module(
                vision_cls,
                tc.vision_config,
                weights["thinker.visual."],
                dtype,
                device,
                "vision encoder (thinker.visual.*)",
            )
        if embed_tokens is None:
            table = weights["thinker.model.embed_tokens."].get("weight")
            if table is None:
                raise ValueError("checkpoint: no thinker.model.embed_tokens.weight")
            embed_tokens = table.to(device=device, dtype=dtype)
        return cls(
            hf_config,
            tokenizer,
            embed_tokens,
            audio_tower=audio_tower,
            visual=visual,
            feature_extractor=feature_extractor,
            image_processor=image_processor,
            dtype=dtype,
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

        audio_features, audio_counts = self._encode_audios(audios)
        image_features, deepstack, grid_thw = self._encode_images(images)
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
        features, counts = self._encode_audios(list(audios))
        if features is None:
            return [], []
        return list(features.split(counts)), counts

    def _encode_audios(self, audios: list[Any]) -> tuple[torch.Tensor | None, list[int]]:
        if not audios:
            return None, []
        rate = self.sampling_rate
        fe = self.feature_extractor
        # The STFT reflect-pads n_fft/2 samples on each side, and one mel frame is a hop.
        min_samples = max(fe.n_fft // 2 + 1, fe.hop_length)
        waves = []
        for k, item in enumerate(audios):
            try:
                wave = load_audio(item, target_rate=rate)
            except ValueError as e:
                raise ValueError(f"audio {k}: {e}") from e
            if len(wave) < min_samples:
                raise ValueError(
                    f"audio {k}: too short ({len(wave)} samples at {rate} Hz; at least "
                    f"{min_samples} needed)"
                )
            waves.append(wave)
        features, frames = self.mel_features(waves)
        counts = self.audio_token_counts(frames)
        for k, n in enumerate(counts):
            if n <= 0:
                raise ValueError(
                    f"audio {k}: too short ({len(waves[k])} samples at {rate} Hz give no "
                    "audio tokens)"
                )
        out = self.audio_tower(
            features.to(self.device), feature_lens=frames.to(self.device), return_dict=True
        ).last_hidden_state
        if out.shape[0] != sum(counts):
            raise RuntimeError(f"audio tower gave {out.shape[0]} rows for {sum(counts)} tokens")
        return out.to(self.dtype), counts

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
        features, deepstack, grid = self._encode_images(list(images))
        if features is None:
            return [], [], grid
        sizes = (grid.prod(-1) // self.spatial_merge_size**2).tolist()
        return list(features.split(sizes)), [list(d.split(sizes)) for d in deepstack], grid

    def _encode_images(
        self, images: list[Any]
    ) -> tuple[torch.Tensor | None, list[torch.Tensor], torch.Tensor]:
        if not images:
            return None, [], torch.zeros(0, 3, dtype=torch.long)
        loaded = []
        for k, item in enumerate(images):
            try:
                loaded.append(load_image(item))
            except ValueError as e:
                raise ValueError(f"image {k}: {e}") from e
        try:
            inputs = self.image_processor(images=loaded, return_tensors="pt")
        except ValueError as e:  # e.g. an aspect ratio over 200
            raise ValueError(f"image: cannot be processed ({e})") from e
        grid = inputs["image_grid_thw"].to(torch.long)
        pixels = inputs["pixel_values"].to(device=self.device, dtype=self.visual.dtype)
        out = self.visual(pixels, grid_thw=grid.to(self.device))
        deepstack = getattr(out, "deepstack_features", None) or ()
        return (
            out.pooler_output.to(self.dtype),
            [d.to(self.dtype) for d in deepstack],
            grid.cpu(),
        )


# -- chat rendering ----------------------------------------------------------------------


def _part_modality(part: Mapping[str, Any]) -> str:
    kind = part.get("type")
    if kind in ("audio", "input_audio", "audio_url") or (
        kind is None and any(k in part for k in ("audio", "input_audio", "audio_url"))
    ):
        return "audio"
    if kind in ("image", "image_url") or (
        kind is None and any(k in part for k in ("image", "image_url"))
    ):
        return "image"
    if kind in ("video", "video_url") or (kind is None and "video" in part):
        return "video"
    if kind == "text" or (kind is None and "text" in part):
        return "text"
    raise ValueError(f"messages: unknown content part type {kind!r}")


def _url_of(value: Any, what: str) -> Any:
    if isinstance(value, Mapping):
        value = value.get("url")
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a URL string or {{'url': ...}}")
    return resolve_url(value)


def _audio_source(part: Mapping[str, Any]) -> Any:
    if "input_audio" in part:
        spec = part["input_audio"]
        if not isinstance(spec, Mapping) or not isinstance(spec.get("data"), str):
            raise ValueError("input_audio: expected {'data': <base64>, 'format': ...}")
        from omnistage.multimodal.media import decode_data_url

        return decode_data_url("data:audio;base64," + spec["data"])
    if "audio_url" in part:
        return _url_of(part["audio_url"], "audio_url")
    if "audio" not in part:
        raise ValueError("audio: content part has no 'audio'")
    value = part["audio"]
    rate = part.get("sampling_rate", part.get("sample_rate"))
    if isinstance(value, str) and value.startswith(("data:", "file://")):
        return resolve_url(value)
    if rate is not None:
        return (value, rate)
    if isinstance(value, (np.ndarray, torch.Tensor)):
        raise ValueError("audio: an array of samples needs 'sampling_rate' in its content part")
    return value


def _image_source(part: Mapping[str, Any]) -> Any:
    if "image_url" in part:
        return _url_of(part["image_url"], "image_url")
    if "image" not in part:
        raise ValueError("image: content part has no 'image'")
    value = part["image"]
    if isinstance(value, str) and (value.startswith("data:") or "://" in value):
        return resolve_url(value)
    return value


def render_chat(
    tokenizer: Any,
    messages: list[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    supported: Iterable[str] = MODALITIES,
    placeholders: Mapping[str, str] | None = None,
) -> ChatPrompt:
    """Render messages with `tokenizer`'s chat template: one placeholder per audio / image
    content part; returns the prompt and the media sources in placeholder order.

    `placeholders` (`{"audio": ..., "image": ...}`, `MediaTokens.placeholders()`): what the
    template must render per item; the count of each is checked against the parts."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("messages: this model has no chat template")
    if not isinstance(messages, list) or not all(
        isinstance(m, Mapping) and "role" in m and "content" in m for m in messages
    ):
        raise ValueError("messages: expected a list of {'role': ..., 'content': ...} dicts")
    supported = frozenset(supported)
    audios: list[Any] = []
    images: list[Any] = []
    rendered = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            rendered.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list) or not all(isinstance(p, Mapping) for p in content):
            raise ValueError("messages: content must be a string or a list of content parts")
        parts = []
        for part in content:
            modality = _part_modality(part)
            if modality == "video":
                raise ValueError("video: video input is not supported")
            if modality != "text" and modality not in supported:
                raise ValueError(f"{modality}: this model does not accept {modality} input")
            if modality == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise ValueError("messages: a text content part needs a string 'text'")
                parts.append({"type": "text", "text": text})
            elif modality == "audio":
                audios.append(_audio_source(part))
                parts.append({"type": "audio", "audio": f"<audio {len(audios) - 1}>"})
            else:
                images.append(_image_source(part))
                parts.append({"type": "image", "image": f"<image {len(images) - 1}>"})
        rendered.append({"role": message["role"], "content": parts})
    prompt = tokenizer.apply_chat_template(
        rendered,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **dict(chat_template_kwargs or {}),
    )
    for name, items in (("audio", audios), ("image", images)):
        placeholder = (placeholders or {}).get(name)
        if placeholder is None:
            continue
        if prompt.count(placeholder) != len(items):
            raise ValueError(
                f"messages: the chat template rendered {prompt.count(placeholder)} {name} "
                f"placeholder(s) for {len(items)} {name} part(s)"
            )
    return ChatPrompt(prompt=prompt, audios=audios, images=images)
