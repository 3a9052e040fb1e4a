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

Audio input (SANM) is not ported: a prompt with audio is refused by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from omnistage.families.ming_omni.config import BailingMMConfig
from omnistage.families.ming_omni.thinker import IMAGE
from omnistage.families.ming_omni.vision import MingImageEncoder
from omnistage.multimodal.prompts import EncodedPrompt

IMAGE_START, IMAGE_PATCH, IMAGE_END = "<image>", "<imagePatch>", "</image>"
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
        return {"image": IMAGE_START}


class MingEncodedPrompt(EncodedPrompt):
    """An `EncodedPrompt` at 1-D positions although it has images."""

    @property
    def uses_mrope(self) -> bool:
        return False


def image_processor(path: Path) -> Any:
    """Qwen2-VL's image processor with the checkpoint's `preprocessor_config.json` settings
    (the reference's defaults where a field is absent)."""
    from transformers import Qwen2VLImageProcessorPil

    file = path / "preprocessor_config.json"
    data = json.loads(file.read_text()) if file.is_file() else {}
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
    """Prompt + images -> `MingEncodedPrompt` (see the module docstring)."""

    model_type: ClassVar[str] = "bailingmm"
    tokens: ClassVar[_Placeholders] = _Placeholders()

    def __init__(
        self,
        config: BailingMMConfig,
        tokenizer: Any,
        embeddings: torch.Tensor,
        images: MingImageEncoder,
        processor: Any,
    ) -> None:
        self.config, self.tokenizer, self.embeddings = config, tokenizer, embeddings
        self.images, self.image_processor = images, processor
        ids = {t: tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_START, IMAGE_PATCH, IMAGE_END)}
        for token, i in ids.items():
            if i is None or i == tokenizer.unk_token_id:
                raise ValueError(f"tokenizer: special token {token!r} is missing")
        if ids[IMAGE_PATCH] != config.llm_config.image_patch_token:
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
        return frozenset({"image"}) if getattr(config, "vision_config", None) else frozenset()

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> MingInputEncoder:
        from transformers import AutoTokenizer

        from omnistage.models.loader import iter_weights

        path = Path(path)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        config = BailingMMConfig.from_pretrained(path)
        if not config.vision_config:
            raise ValueError(
                f"{os.fspath(path)}: vision_config: this checkpoint has no image encoder"
            )
        embeddings = dict(iter_weights(path, (EMBEDDINGS,)))[EMBEDDINGS].to(dtype)
        encoder = MingImageEncoder.from_checkpoint(path, config, dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(config, tokenizer, embeddings, encoder, image_processor(path))

    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> MingEncodedPrompt:
        if len(audios):
            raise ValueError("audio: Ming-Omni audio input is not supported yet")
        pixels, grid = self._pixels(images)
        counts = self.images.num_tokens(grid) if len(images) else []
        ids = self._expanded_ids(prompt, counts)
        ids_t = torch.tensor(ids, dtype=torch.int64)
        patch = ids_t == self.ids[IMAGE_PATCH]
        rows = self.embeddings[ids_t].clone()
        kinds = torch.zeros(len(ids), dtype=torch.int64)
        if counts:
            rows[patch] = self.images(pixels, grid).to(rows.dtype)
            where = patch.nonzero().flatten()
            kinds[int(where[0]) : int(where[-1]) + 1] = IMAGE
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
            token_modality=kinds if counts else None,
        )

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
