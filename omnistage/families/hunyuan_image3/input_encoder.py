"""HunyuanImage-3's multimodal processor: a prompt with image placeholders and its images ->
the expanded token ids, the decoder's input rows and their 2-D positions (`EncodedPrompt`),
what its thinker consumes for image-to-text.

The chat template renders each image as `<boi><img><eoi>`; each becomes the reference's
joint-image block (`image_input.py`), whose rows are:

- `<img>` x h*w: the VAE encoder's latents of the image (`vae_encoder.py`), through the
  image head's `patch_embed` at t = 0 (`time_embed(0)`), as the reference's
  `instantiate_vae_image_tokens` does for a conditioning image;
- `<timestep>`: `timestep_emb(0)` (the reference's clean-image time);
- `<img>` x P after `<joint_img_sep>`: the vision encoder's rows (`vision.py`);
- every other token: `wte`.

The positions go out as [3, L] (index, row, column): the engine's rotary positions for
prompts with images; the thinker rotates by row and column (`model.py`). Generated
tokens take plain positions: text after an image resumes at its sequence index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from transformers import AutoTokenizer

from omnistage.families.hunyuan_image3.config import MODEL_TYPE, HunyuanImage3Config
from omnistage.families.hunyuan_image3.denoise import read_weights
from omnistage.families.hunyuan_image3.image_head import ImageHead
from omnistage.families.hunyuan_image3.image_input import (
    ImageSection,
    as_rgb,
    section_positions,
    vae_pixels,
)
from omnistage.families.hunyuan_image3.resolution import takes_images
from omnistage.families.hunyuan_image3.tokens import EXTRA_RATIOS, NUM_RATIOS
from omnistage.families.hunyuan_image3.vae_encoder import VaeEncoder
from omnistage.families.hunyuan_image3.vision import PREFIXES as VISION_PREFIXES
from omnistage.families.hunyuan_image3.vision import HunyuanVisionEncoder
from omnistage.multimodal.prompts import EncodedPrompt

PLACEHOLDER = "<boi><img><eoi>"


class _Placeholders:
    def placeholders(self) -> dict[str, str]:
        return {"image": PLACEHOLDER}


class HunyuanImage3InputEncoder:
    model_type: ClassVar[str] = MODEL_TYPE
    tokens: ClassVar[_Placeholders] = _Placeholders()

    def __init__(self, config: HunyuanImage3Config, tokenizer: Any, weights: dict, dtype) -> None:
        self.config, self.tokenizer, self.dtype = config, tokenizer, dtype
        self.wte = weights["model.wte.weight"].to(dtype)
        self.head = ImageHead(config, dtype)
        self.head.load(weights)
        self.vae = VaeEncoder(config.vae, dtype)
        self.vae.load(weights)
        self.vision = HunyuanVisionEncoder(config, dtype)
        self.vision.load(weights)
        self.base = config.image_base_size
        names = [*_TOKENS, f"<img_size_{self.base}>"]
        names += [f"<img_ratio_{i}>" for i in (*range(NUM_RATIOS), *EXTRA_RATIOS)]
        ids = {name: tokenizer.convert_tokens_to_ids(name) for name in names}
        missing = [name for name, i in ids.items() if i is None or i == tokenizer.unk_token_id]
        if missing:
            raise ValueError(f"tokenizer: special token {missing[0]!r} is missing")
        self.ids = ids

    @classmethod
    def supported_modalities(cls, config: Any) -> frozenset[str]:
        if getattr(config, "model_type", None) != cls.model_type or not getattr(
            config, "vit", None
        ):
            return frozenset()
        # the reference cannot lay out an input image below base 256 (`check_image_base`)
        if not takes_images(int(getattr(config, "image_base_size", 1024))):
            return frozenset()
        return frozenset({"image"})

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, dtype: torch.dtype | str = torch.float32, **_: Any
    ) -> HunyuanImage3InputEncoder:
        path = Path(path)
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        config = HunyuanImage3Config(**json.loads((path / "config.json").read_text()))
        tokenizer = AutoTokenizer.from_pretrained(path)
        parts = ("model.wte.", "vae.encoder.", *ImageHead.PREFIXES, *VISION_PREFIXES)
        return cls(config, tokenizer, read_weights(path, parts), dtype)

    def encode(
        self, prompt: str | Sequence[int], audios: Sequence[Any] = (), images: Sequence[Any] = ()
    ) -> EncodedPrompt:
        if len(audios):
            raise ValueError("audio: HunyuanImage-3 does not accept audio input")
        ids = (
            self.tokenizer(prompt, add_special_tokens=False).input_ids
            if isinstance(prompt, str)
            else [int(t) for t in prompt]
        )
        starts = self._placeholders(ids)
        if len(starts) != len(images):
            raise ValueError(
                f"image: the prompt has {len(starts)} image placeholder(s) for "
                f"{len(images)} image(s)"
            )
        return self._expand(ids, starts, [as_rgb(image) for image in images])

    def _placeholders(self, ids: list[int]) -> list[int]:
        triple = [self.ids["<boi>"], self.ids["<img>"], self.ids["<eoi>"]]
        return [i for i in range(len(ids) - 2) if ids[i : i + 3] == triple]

    @torch.no_grad()
    def _image_block(self, image: Any) -> tuple[list[int], torch.Tensor, tuple[int, ...]]:
        """One image's block ids, rows [n, hidden] and (offset of its VAE run, h, w, offset
        of its ViT run, patch rows, patch columns)."""
        ratio, pixels = vae_pixels(image, self.base)
        latents = self.vae(pixels.to(self.dtype))
        t0 = torch.zeros(1)
        vae_rows = self.head.patch_embed(latents, self.head.time_embed(t0))[0]
        patches = self.vision.patches(np.asarray(image))
        vit_rows = self.vision(patches)
        h, w = latents.shape[-2:]
        grid = patches["spatial_shapes"][0].tolist()
        tok = self.ids
        head = [tok["<boi>"], tok[f"<img_size_{self.base}>"], tok[f"<img_ratio_{ratio}>"]]
        ids = [*head, tok["<timestep>"], *[tok["<img>"]] * (h * w), tok["<joint_img_sep>"]]
        ids += [tok["<img>"]] * len(vit_rows) + [tok["<eoi>"]]
        rows = self.wte[torch.tensor(ids)].clone()
        rows[3] = self.head.timestep_emb(t0)[0]
        rows[4 : 4 + h * w] = vae_rows
        rows[5 + h * w : 5 + h * w + len(vit_rows)] = vit_rows
        return ids, rows, (4, h, w, 5 + h * w, grid[0], grid[1])

    def _expand(self, ids: list[int], starts: list[int], images: list[Any]) -> EncodedPrompt:
        out_ids: list[int] = []
        rows: list[torch.Tensor] = []
        sections: list[ImageSection] = []
        grids = []
        last = 0
        for start, image in zip(starts, images, strict=True):
            out_ids += ids[last:start]
            rows.append(self.wte[torch.tensor(ids[last:start], dtype=torch.int64)])
            block, block_rows, (vae_at, h, w, vit_at, gh, gw) = self._image_block(image)
            at = len(out_ids)
            sections += [ImageSection(at + vae_at, h, w), ImageSection(at + vit_at, gh, gw)]
            grids.append([1, gh, gw])
            out_ids += block
            rows.append(block_rows)
            last = start + 3
        out_ids += ids[last:]
        rows.append(self.wte[torch.tensor(ids[last:], dtype=torch.int64)])
        n = len(out_ids)
        yx = section_positions(n, sections)
        image_mask = torch.tensor(out_ids) == self.ids["<img>"]
        return EncodedPrompt(
            prompt_token_ids=out_ids,
            prompt_embeds=torch.cat(rows),
            mrope_positions=torch.cat([torch.arange(n)[None], yx.t()]),
            rope_delta=0,
            audio_mask=torch.zeros(n, dtype=torch.bool),
            visual_pos_mask=image_mask,
            deepstack_embeds=[],
            audio_token_counts=[],
            image_grid_thw=torch.tensor(grids, dtype=torch.int64).reshape(-1, 3),
        )


_TOKENS = ("<boi>", "<eoi>", "<img>", "<timestep>", "<joint_img_sep>")
