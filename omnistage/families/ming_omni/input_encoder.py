"""Ming-Omni's multimodal processor: a prompt with `<image>` placeholders and its images ->
the expanded ids, the thinker's input rows and the per-token modality (`EncodedPrompt`).

As the reference (`processing_bailingmm.py` `_expand_image_tokens`,
`modeling_bailingmm.py` `prompt_wrap_vision`, commit 4876ed4):

- each `<image>` becomes `<image>` + `<imagePatch>` x n + `</image>` + `"\\n"`, n = the
  image's patches over the 2x2 merge; a text prompt is expanded as text, then tokenized
  (what the reference's processor tokenizes); a prompt of ids gets the same ids inserted;
- the rows are the thinker's `word_embeddings` with the image encoder's rows
  (`vision.MingImageEncoder`) at the `<imagePatch>` positions, images in order;
- each image is first resized as the reference's `process_vision_info` does
  (`bailingmm_utils.fetch_image`: RGB, `smart_resize` to multiples of 28 within
  `[4, 1024] x 28 x 28` pixels, Pillow's bicubic), then goes through the image processor,
  Qwen2-VL's (`BailingMMImageProcessor` is a copy: `smart_resize` to multiples of
  patch x merge within `[min_pixels, max_pixels]`, rescale, CLIP normalization, temporal
  tiling), read from `preprocessor_config.json`;
- positions are plain 1-D (the thinker has no M-RoPE);
- the per-token modality: IMAGE from the first `<imagePatch>` of the prompt through its
  last (the reference's `image_start_indices` / `image_end_indices` select
  `first - 1 < i < last + 1`), so with several images the text between them routes
  through `image_gate` too, as in the reference.

Audio (`processing_bailingmm.py` `_expand_audio_tokens`, `audio_processing_bailingmm.py`,
`modeling_bailingmm.py` `prompt_wrap_audio`): at most one clip per prompt (the reference
asserts one); its features (`fbank.WavFrontend`, `wav_frontend_args` of
`preprocessor_config.json`) have T frames, and `<audio>` becomes `<audio>` +
`<audioPatch>` x T + `</audio>` (a prompt without `<audio>` gets that block and a newline
appended, as the reference does); the rows (`sanm.MingAudioEncoder`) go at the
`<audioPatch>` run, which is the AUDIO span (the reference's `loc - 1 < i < loc + T`).
The clip is read as mono 16 kHz (`media.load_audio`: channels averaged, soxr resampling;
the reference takes channel 0 and resamples with torchaudio).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.ming_omni.config import BailingMMConfig
from omnistage.families.ming_omni.fbank import WavFrontend
from omnistage.families.ming_omni.sanm import MingAudioEncoder
from omnistage.families.ming_omni.thinker import AUDIO, IMAGE
from omnistage.families.ming_omni.vision import MingImageEncoder
from omnistage.multimodal.prompts import EncodedPrompt

IMAGE_START, IMAGE_PATCH, IMAGE_END = "<image>", "<imagePatch>", "</image>"
AUDIO_START, AUDIO_PATCH, AUDIO_END = "<audio>", "<audioPatch>", "</audio>"
EMBEDDINGS = "model.model.word_embeddings.weight"
FETCH_FACTOR, FETCH_MIN_PIXELS, FETCH_MAX_PIXELS = 28, 4 * 28 * 28, 1024 * 28 * 28
"""`bailingmm_utils.fetch_image`'s resize (`IMAGE_FACTOR`, `MIN_PIXELS`, `MAX_PIXELS`)."""
PROCESSOR_FIELDS = (
    "min_pixels",
    "max_pixels",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "image_mean",
    "image_std",
)


class _Placeholders:
    def placeholders(self) -> dict[str, str]:
        return {"image": IMAGE_START, "audio": AUDIO_START}


def special_token_ids(tokenizer: Any, names: Sequence[str]) -> dict[str, int]:
    """The ids of the special tokens `names`; a ValueError naming one the tokenizer lacks."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in names}
    for token, i in ids.items():
        if i is None or i == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer: special token {token!r} is missing")
    return ids


class MingEncodedPrompt(EncodedPrompt):
    """An `EncodedPrompt` at 1-D positions although it has images."""

    @property
    def uses_mrope(self) -> bool:
        return False


def _preprocessor(path: Path) -> dict[str, Any]:
    file = path / "preprocessor_config.json"
    return json.loads(file.read_text()) if file.is_file() else {}


def wav_frontend(path: Path) -> WavFrontend:
    """The audio features' settings: `wav_frontend_args` of `preprocessor_config.json`."""
    args = _preprocessor(path).get("wav_frontend_args")
    if not isinstance(args, dict):
        raise ValueError(f"{path}/preprocessor_config.json: wav_frontend_args: missing")
    return WavFrontend.from_args(args, path)


def image_processor(path: Path) -> Any:
    """Qwen2-VL's image processor with the checkpoint's `preprocessor_config.json` settings
    (the reference's defaults where a field is absent)."""
    from transformers import Qwen2VLImageProcessorPil

    data = _preprocessor(path)
    settings = {
        "min_pixels": 56 * 56,
        "max_pixels": 28 * 28 * 1280,
        "patch_size": 14,
        "merge_size": 2,
        "temporal_patch_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
    } | {k: data[k] for k in PROCESSOR_FIELDS if k in data}
    size = {"shortest_edge": settings.pop("min_pixels"), "longest_edge": settings.pop("max_pixels")}
    return Qwen2VLImageProcessorPil(size=size, **settings)


def fetch_image(image: Any) -> Any:
    """A PIL image resized as `bailingmm_utils.fetch_image` resizes it."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    image = image.convert("RGB")
    width, height = image.size
    try:
        h, w = smart_resize(height, width, FETCH_FACTOR, FETCH_MIN_PIXELS, FETCH_MAX_PIXELS)
    except ValueError as e:  # an aspect ratio over 200
        raise ValueError(f"image: cannot be processed ({e})") from e
    return image.resize((w, h))


class MingInputEncoder:
    """Prompt + images + audio -> `MingEncodedPrompt` (see the module docstring)."""

    model_type: ClassVar[str] = "bailingmm"
    tokens: ClassVar[_Placeholders] = _Placeholders()

    def __init__(
        self,
        config: BailingMMConfig,
        tokenizer: Any,
        embeddings: torch.Tensor,
        images: MingImageEncoder | None,
        processor: Any,
        audio: MingAudioEncoder | None = None,
        frontend: WavFrontend | None = None,
    ) -> None:
        self.config, self.tokenizer, self.embeddings = config, tokenizer, embeddings
        self.images, self.image_processor = images, processor
        self.audio, self.frontend = audio, frontend
        names = (IMAGE_START, IMAGE_PATCH, IMAGE_END) if images is not None else ()
        names += (AUDIO_START, AUDIO_PATCH, AUDIO_END) if audio is not None else ()
        ids = special_token_ids(tokenizer, names)
        if images is not None and ids[IMAGE_PATCH] != config.llm_config.image_patch_token:
            raise ValueError(
                f"llm_config.image_patch_token: {config.llm_config.image_patch_token}, but the "
                f"tokenizer's {IMAGE_PATCH} is {ids[IMAGE_PATCH]}"
            )
        self.ids = ids
        self.newline = tokenizer("\n", add_special_tokens=False).input_ids

    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        if getattr(config, "model_type", None) != cls.model_type:
            return frozenset()
        found = {"image"} if getattr(config, "vision_config", None) else set()
        return frozenset(found | ({"audio"} if getattr(config, "audio_config", None) else set()))

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> MingInputEncoder:
        from transformers import AutoTokenizer

        from omnistage.models.loader import iter_weights

        path = Path(path)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        config = BailingMMConfig.from_pretrained(path)
        if not config.vision_config and not config.audio_config:
            raise ValueError(
                f"{os.fspath(path)}: vision_config, audio_config: this checkpoint has no "
                "image or audio encoder"
            )
        embeddings = dict(iter_weights(path, (EMBEDDINGS,)))[EMBEDDINGS].to(dtype)
        images = processor = audio = frontend = None
        if config.vision_config:
            images = MingImageEncoder.from_checkpoint(path, config, dtype)
            processor = image_processor(path)
        if config.audio_config:
            audio = MingAudioEncoder.from_checkpoint(path, config, dtype)
            frontend = wav_frontend(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(config, tokenizer, embeddings, images, processor, audio, frontend)

    def audio_features(self, item: Any) -> torch.Tensor:
        """[frames, dim] features of one clip (a file, its bytes, `(samples, rate)`, or
        samples at 16 kHz)."""
        from omnistage.multimodal.media import load_audio

        if self.frontend is None:
            raise ValueError("audio: this Ming-Omni checkpoint has no audio encoder")
        rate = self.frontend.fs
        if isinstance(item, (tuple, str, os.PathLike, bytes, bytearray, memoryview)):
            wave = load_audio(item, target_rate=rate)
        else:
            wave = load_audio(item, rate, target_rate=rate)
        return self.frontend(torch.from_numpy(wave))

    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> MingEncodedPrompt:
        if len(images) and self.images is None:
            raise ValueError("image: this Ming-Omni checkpoint has no image encoder")
        if len(audios) and self.audio is None:
            raise ValueError("audio: this Ming-Omni checkpoint has no audio encoder")
        if len(audios) > 1:
            raise ValueError(f"audio: {len(audios)} clips; Ming-Omni takes one per prompt")
        pixels, grid = self._pixels(images)
        counts = self.images.num_tokens(grid) if len(images) else []
        feats = self.audio_features(audios[0]) if len(audios) else None
        ids = self._expanded_ids(prompt, counts)
        if feats is not None:
            ids = self._audio_ids(ids, self.audio.num_tokens(feats.shape[0]))
        ids_t = torch.tensor(ids, dtype=torch.int64)
        rows = self.embeddings[ids_t].clone()
        kinds = torch.zeros(len(ids), dtype=torch.int64)
        patch = torch.zeros(len(ids), dtype=torch.bool)
        if counts:
            patch = ids_t == self.ids[IMAGE_PATCH]
            rows[patch] = self.images(pixels, grid).to(rows.dtype)
            where = patch.nonzero().flatten()
            kinds[int(where[0]) : int(where[-1]) + 1] = IMAGE
        if feats is not None:
            heard = ids_t == self.ids[AUDIO_PATCH]
            rows[heard] = self.audio(feats).to(rows.dtype)
            kinds[heard] = AUDIO
        return self._encoded(ids, rows, patch, grid, kinds if counts or feats is not None else None)

    def _encoded(
        self,
        ids: list[int],
        rows: torch.Tensor,
        patch: torch.Tensor,
        grid: torch.Tensor,
        kinds: torch.Tensor | None,
    ) -> MingEncodedPrompt:
        n = len(ids)
        return MingEncodedPrompt(
            prompt_token_ids=ids,
            prompt_embeds=rows,
            mrope_positions=torch.arange(n).expand(3, -1).clone(),
            rope_delta=0,
            audio_mask=torch.zeros(n, dtype=torch.bool),
            visual_pos_mask=patch,
            deepstack_embeds=[],
            audio_token_counts=[],
            image_grid_thw=grid,
            token_modality=kinds,
        )

    def _audio_ids(self, ids: list[int], frames: int) -> list[int]:
        """`ids` with the clip's block at its `<audio>` (appended with a newline when the
        prompt has none; more than one `<audio>` is a ValueError)."""
        start, end, patch = (self.ids[t] for t in (AUDIO_START, AUDIO_END, AUDIO_PATCH))
        if any(t in (end, patch) for t in ids):
            raise ValueError(f"audio: the prompt already has {AUDIO_PATCH} / {AUDIO_END} tokens")
        found = ids.count(start)
        if found > 1:
            raise ValueError(f"audio: the prompt has {found} {AUDIO_START} placeholders for 1 clip")
        block = [start] + [patch] * frames + [end]
        if found == 0:
            return ids + block + self.newline
        at = ids.index(start)
        return ids[:at] + block + ids[at + 1 :]

    def _pixels(self, images: Sequence[Any]) -> tuple[torch.Tensor | None, torch.Tensor]:
        if not len(images):
            return None, torch.zeros(0, 3, dtype=torch.long)
        from omnistage.multimodal.media import load_image

        loaded = []
        for k, item in enumerate(images):
            try:
                loaded.append(fetch_image(load_image(item)))
            except ValueError as e:
                raise ValueError(f"image {k}: {e}") from e
        try:
            out = self.image_processor(images=loaded, return_tensors="pt")
        except ValueError as e:
            raise ValueError(f"image: cannot be processed ({e})") from e
        return out["pixel_values"], out["image_grid_thw"].to(torch.long)

    def _expanded_ids(self, prompt: str | Sequence[int], counts: list[int]) -> list[int]:
        """The prompt with each `<image>` expanded to its image's block (ValueError when the
        placeholders and the images do not pair up)."""
        start = self.ids[IMAGE_START]
        if isinstance(prompt, str):
            found = prompt.count(IMAGE_START)
        else:
            prompt = [int(t) for t in prompt]
            found = prompt.count(start)
        if found != len(counts):
            raise ValueError(
                f"image: the prompt has {found} {IMAGE_START} placeholder(s) for "
                f"{len(counts)} image(s)"
            )
        if isinstance(prompt, str):
            parts = prompt.split(IMAGE_START)
            text = parts[0]
            for n, rest in zip(counts, parts[1:], strict=True):
                text += IMAGE_START + IMAGE_PATCH * n + IMAGE_END + "\n" + rest
            return self.tokenizer(text, add_special_tokens=False).input_ids
        out: list[int] = []
        images = iter(counts)
        for t in prompt:
            out.append(t)
            if t == start:
                block = [self.ids[IMAGE_PATCH]] * next(images) + [self.ids[IMAGE_END]]
                out += block + self.newline
        return out
