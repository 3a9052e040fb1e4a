"""An input image as Bagel reads it: its size, its pixels, and its two context blocks.

- **Size** (`fit_size`): the reference's `MaxLongEdgeMinShortEdgeResize` — scale the
  longest side down to `max_size`, the shortest up to `min_size`, the pixel count under
  `max_pixels`, each side rounded to a multiple of `stride`. The VAE view uses the
  latent stride (an edit draws at that size), the ViT view the ViT patch.
- **Pixels** (`to_pixels`): RGB, resized with PIL's bicubic filter when the size changes
  (the reference uses torchvision's bicubic with antialias: a resized image can differ
  from it by rounding; an image already at its size is read exactly as the reference
  reads it), then `[3, H, W]` in [-1, 1] (`ToTensor`, `Normalize(0.5, 0.5)`).
- **Blocks** (`vae_block`, `vit_block`): `<|vision_start|>`, the image's tokens,
  `<|vision_end|>`, prefilled after a context in one non-causal pass at one RoPE
  position (`mot.MoTLanguageModel.prefill_image`). VAE tokens are the encoded latents'
  patches (`vae2llm` + the timestep-0 embedding + `latent_pos_embed`) through the
  generation expert; ViT tokens are `vision.BagelVision.embed`'s rows through the
  understanding expert. The reference's editing context is the VAE block then the ViT
  block, its understanding context the ViT block alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.families.bagel.autoencoder import AutoEncoder
from omnistage.families.bagel.context import KVContext
from omnistage.families.bagel.generator import BagelGenerator
from omnistage.families.bagel.vision import BagelVision, grid_ids

MAX_PIXELS = 14 * 14 * 9 * 1024
"""The reference's `ImageTransform` default."""


@dataclass(frozen=True)
class ImageBounds:
    """One `ImageTransform` of the reference: sides in [min_size, max_size], multiples of
    `stride`."""

    max_size: int
    min_size: int
    stride: int
    max_pixels: int = MAX_PIXELS

    def fit_size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the reference resizes a `width` x `height` image to."""
        if width < 1 or height < 1:
            raise ValueError(f"image: empty image ({width}x{height})")
        scale = min(self.max_size / max(width, height), 1.0)
        scale = max(scale, self.min_size / min(width, height))
        w, h = self._scaled(width, height, scale)
        if w * h > self.max_pixels:
            w, h = self._scaled(w, h, self.max_pixels / (w * h))
        if max(w, h) > self.max_size:
            w, h = self._scaled(w, h, self.max_size / max(w, h))
        return w, h

    def _scaled(self, width: int, height: int, scale: float) -> tuple[int, int]:
        def side(v: float) -> int:
            return max(self.stride, int(round(round(v) / self.stride) * self.stride))

        return side(width * scale), side(height * scale)

    def resize(self, image: Any) -> Any:
        """A PIL image (or `[H, W, 3]` uint8 array) as an RGB PIL image of `fit_size`."""
        from PIL import Image

        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image, dtype=np.uint8))
        image = image.convert("RGB")
        size = self.fit_size(*image.size)
        return image if size == image.size else image.resize(size, Image.BICUBIC)

    def to_pixels(self, image: Any) -> torch.Tensor:
        """`resize(image)` as `[3, H, W]` float32 in [-1, 1]."""
        array = np.asarray(self.resize(image), dtype=np.float32) / 255.0
        return (torch.from_numpy(array).permute(2, 0, 1) - 0.5) / 0.5


def vae_block(
    generator: BagelGenerator,
    vae: AutoEncoder,
    pixels: torch.Tensor,
    markers: tuple[int, int],
    context: KVContext,
    noise: torch.Tensor | None,
) -> KVContext:
    """`context` grown by the VAE block of `pixels` (`[3, H, W]`, sides multiples of the
    latent stride); `noise`: the posterior sample's (`[1, z, H / 8, W / 8]`), None: mean."""
    config = generator.config
    p, c = config.latent_patch_size, config.vae.z_channels
    h, w = pixels.shape[1] // config.latent_downsample, pixels.shape[2] // config.latent_downsample
    z = vae.encode(pixels[None].to(generator.dtype), noise)[0]
    z = z[:, : h * p, : w * p].reshape(c, h, p, w, p)
    patches = torch.einsum("chpwq->hwpqc", z).reshape(-1, p * p * c)
    with torch.inference_mode():
        tokens = (
            generator.vae2llm(patches)
            + generator.time_embedder(torch.zeros(1))
            + generator.latent_pos_embed(grid_ids(h, w, config.max_latent_size))
        )
    return _prefill(generator, tokens, markers, context, gen=True)


def vit_block(
    generator: BagelGenerator,
    vision: BagelVision,
    pixels: torch.Tensor,
    markers: tuple[int, int],
    context: KVContext,
) -> KVContext:
    """`context` grown by the ViT block of `pixels` (sides multiples of the ViT patch)."""
    return _prefill(generator, vision.embed(pixels), markers, context, gen=False)


def _prefill(
    generator: BagelGenerator,
    tokens: torch.Tensor,
    markers: tuple[int, int],
    context: KVContext,
    gen: bool,
) -> KVContext:
    lm = generator.language_model
    with torch.inference_mode():
        ends = lm.model.embed_tokens(torch.tensor(markers))
        block = torch.cat([ends[:1], tokens.to(ends.dtype), ends[1:]])
    rows = torch.arange(1, 1 + tokens.shape[0]) if gen else None
    return lm.prefill_image(block, rows, context)
