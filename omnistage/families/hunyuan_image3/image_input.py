"""How HunyuanImage-3 lays out an input image in its context (the reference's joint image):
its token block, its VAE pixels and the 2-D positions of the whole prompt.

As the reference's `TokenizerWrapper` writes a `joint_image` section (`use_front_boi_token`,
`add_image_shape_token`, `add_timestep_token`, its defaults):

    <boi> <img_size_B> <img_ratio_r> <timestep> <img> x h*w <joint_img_sep> <img> x P <eoi>

the h x w VAE latent tokens of the image resized to size r of the resolution group, then
the P = `max_num_patches` SigLIP2 tokens. Both image runs (and the separator between
them) attend to each other both ways; text stays causal.

Positions (`build_2d_rope`): text takes (i, i) at sequence index i; an image run of
h x w tokens from index L takes centred (row, column) positions L + (wh - h)/2 + row,
L + (wh - w)/2 + col (truncated), and what follows resumes from L + wh, so the ViT run,
whose grid (patch rows x columns) may hold fewer than P tokens, gives its padding rows
the indices that follow its grid, exactly as the reference's concatenation does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from omnistage.families.hunyuan_image3.resolution import check_image_base, resolution_group


@dataclass(frozen=True)
class ImageSection:
    """One image run in the sequence: its first index and its grid."""

    start: int
    height: int
    width: int


def section_positions(seq_len: int, sections: list[ImageSection]) -> torch.Tensor:
    """[seq_len, 2] int64 (y, x) positions of a sequence with these image runs (in order)."""
    ys: list[torch.Tensor] = []
    xs: list[torch.Tensor] = []
    last = 0
    for s in sections:
        if last < s.start:
            ys.append(torch.arange(last, s.start))
            xs.append(torch.arange(last, s.start))
        n = s.height * s.width
        rows = torch.arange(s.height, dtype=torch.float64).repeat_interleave(s.width)
        cols = torch.arange(s.width, dtype=torch.float64).repeat(s.height)
        ys.append((s.start + (n - s.height) / 2 + rows).long())
        xs.append((s.start + (n - s.width) / 2 + cols).long())
        last = s.start + n
    ys.append(torch.arange(last, seq_len))
    xs.append(torch.arange(last, seq_len))
    return torch.stack([torch.cat(ys)[:seq_len], torch.cat(xs)[:seq_len]], dim=1)


def target_size(base: int, height: int, width: int) -> tuple[int, int, int]:
    """(ratio index, height, width): the group's size whose height/width is nearest."""
    sizes = resolution_group(base)
    ratios = np.array([h / w for h, w in sizes])
    index = int(np.argmin(np.abs(ratios - height / width)))
    return index, *sizes[index]


def _resize_and_crop(image: Image.Image, width: int, height: int) -> Image.Image:
    """The reference's `resize_and_crop`: cover the target (Lanczos), centre crop."""
    w, h = image.size
    if h / w < height / width:
        size = (int(round(height / h * w)), height)
    else:
        size = (width, int(round(width / w * h)))
    image = image.resize(size, resample=Image.Resampling.LANCZOS)
    top = int(round((size[1] - height) / 2.0))
    left = int(round((size[0] - width) / 2.0))
    return image.crop((left, top, left + width, top + height))


def as_rgb(image: np.ndarray) -> Image.Image:
    """A decoded image ([H, W], [H, W, 3] or [H, W, 4] uint8) as an RGB PIL image."""
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim not in (2, 3) or min(array.shape[:2]) < 1:
        raise ValueError("image: expected an 8-bit [H, W] or [H, W, C] image")
    return Image.fromarray(array).convert("RGB")


def vae_pixels(image: Image.Image, base: int) -> tuple[int, torch.Tensor]:
    """(ratio index, [1, 3, H, W] float32 in [-1, 1]): the image at the group's nearest
    size, as the Instruct reference's `vae_process_image` gives its VAE; ValueError naming
    `image` at a base size whose group the reference cannot build (`check_image_base`)."""
    check_image_base(base)
    index, height, width = target_size(base, image.height, image.width)
    pixels = np.asarray(_resize_and_crop(image, width, height), dtype=np.float32) / 255.0
    tensor = torch.from_numpy(pixels).permute(2, 0, 1)[None]
    return index, (tensor - 0.5) / 0.5  # ToTensor, Normalize([0.5], [0.5])
