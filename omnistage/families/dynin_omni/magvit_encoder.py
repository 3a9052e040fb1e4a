"""MAGVITv2's image encoder (Show-o's `VQGANEncoder` and `LFQuantizer.get_indices`, as
Dynin-Omni's image understanding uses them: `MAGVITv2.get_code`), and the reference's image
preprocessing (vLLM-Omni's Dynin i2t example, `preprocess_image`).

An RGB image is resized (bicubic, PIL) so its short side is the encoder's resolution,
center-cropped square, scaled to [-1, 1]; the encoder (`encoder.*`: conv_in, levels of
ResNet blocks with a strided conv between levels, the middle block with attention, norm,
conv_out, quant_conv) gives z_channels values per code position; the look-up-free
quantizer's code is the bits `z > 0`, most significant channel first, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.dynin_omni.magvit import AttnBlock, ResnetBlock, _Mid, _norm


@dataclass(frozen=True)
class EncoderConfig:
    """`VQGANEncoder`'s arguments (Show-o's defaults, which MAGVITv2 builds)."""

    ch: int = 128
    ch_mult: tuple[int, ...] = field(default=(1, 2, 2, 4, 4))
    num_res_blocks: tuple[int, ...] = field(default=(4, 3, 4, 3, 4))
    attn_resolutions: tuple[int, ...] = field(default=(5,))
    in_ch: int = 3
    resolution: int = 256
    """Input pixels a side."""
    z_channels: int = 13

    def __post_init__(self) -> None:
        if len(self.ch_mult) != len(self.num_res_blocks):
            raise ValueError("encoder.num_res_blocks: needs one entry per ch_mult level")
        if self.ch % 32:
            raise ValueError(f"encoder.ch: {self.ch} is no multiple of 32 (GroupNorm groups)")

    @property
    def grid(self) -> int:
        """Codes a side."""
        return self.resolution // 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EncoderConfig:
        known = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        return cls(**kw)


class Downsample(nn.Module):
    """A stride-2 3x3 conv after zero padding right and bottom by one."""

    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=0, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1), mode="constant", value=0.0))


class _Down(nn.Module):
    def __init__(self, blocks: list[nn.Module], attn: list[nn.Module], down: bool, ch: int, dtype):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList(attn)
        self.downsample = Downsample(ch, dtype) if down else None


class VQGANEncoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, dtype: torch.dtype) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(cfg.in_ch, cfg.ch, 3, padding=1, dtype=dtype)
        res, mults, levels = cfg.resolution, (1, *cfg.ch_mult), len(cfg.ch_mult)
        down: list[_Down] = []
        block_in = cfg.ch
        for i in range(levels):
            block_in, out = cfg.ch * mults[i], cfg.ch * cfg.ch_mult[i]
            blocks, attn = [], []
            for _ in range(cfg.num_res_blocks[i]):
                blocks.append(ResnetBlock(block_in, out, dtype))
                block_in = out
                if res in cfg.attn_resolutions:
                    attn.append(AttnBlock(block_in, dtype))
            down.append(_Down(blocks, attn, i != levels - 1, block_in, dtype))
            res = res // 2 if i != levels - 1 else res
        self.down = nn.ModuleList(down)
        self.mid = _Mid(block_in, dtype)
        self.norm_out = _norm(block_in, dtype)
        self.conv_out = nn.Conv2d(block_in, cfg.z_channels, 3, padding=1, dtype=dtype)
        self.quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(x)
        for level in self.down:
            for i, block in enumerate(level.block):
                h = block(h)
                if len(level.attn) > 0:
                    h = level.attn[i](h)
            if level.downsample is not None:
                h = level.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.quant_conv(self.conv_out(F.silu(self.norm_out(h))))


def lfq_codes(z: torch.Tensor) -> torch.Tensor:
    """`[b, bits, h, w]` encoder output -> `[b, h * w]` codes (`LFQuantizer.get_indices`:
    bit i of a code is channel i > 0, channel 0 the most significant)."""
    bits = z.shape[1]
    powers = 2 ** torch.arange(bits - 1, -1, -1, dtype=torch.long)
    return ((z > 0).long() * powers.view(1, -1, 1, 1)).sum(1).reshape(z.shape[0], -1)


def preprocess_image(image: np.ndarray, resolution: int) -> torch.Tensor:
    """`[H, W, 3]` uint8 -> `[3, r, r]` float32 in [-1, 1]: the short side resized to `r`
    (PIL bicubic, rounded sizes), center-cropped (vLLM-Omni's Dynin i2t `preprocess_image`)."""
    from PIL import Image

    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image: expected [H, W, 3] uint8 RGB, got {image.dtype} {image.shape}")
    picture = Image.fromarray(image)
    w, h = picture.size
    scale = resolution / min(w, h)
    new_w, new_h = round(w * scale), round(h * scale)
    picture = picture.resize((new_w, new_h), Image.BICUBIC)
    left, top = (new_w - resolution) // 2, (new_h - resolution) // 2
    picture = picture.crop((left, top, left + resolution, top + resolution))
    arr = torch.from_numpy(np.array(picture, dtype=np.float32) / 255.0).permute(2, 0, 1)
    return (arr - 0.5) / 0.5
