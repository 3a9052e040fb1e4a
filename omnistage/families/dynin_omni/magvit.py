"""MAGVITv2's image decoder (Show-o's `modeling_magvitv2.py`, as Dynin-Omni ships it):
lookup-free quantizer codes -> pixels, in its parameter names (`decoder.conv_in`,
`decoder.mid.block_1.norm1`, `decoder.up.N.block.M.conv1`, `decoder.up.N.upsample.conv`,
`decoder.norm_out`, `decoder.conv_out`, `decoder.post_quant_conv`).

A code `c` of a `2**z_channels` codebook is its bits, most significant first, as +-1
(`LFQuantizer.get_codebook_entry`): the codebook holds no weights. The decoder's sizes
are MAGVITv2's (a 16x16 grid of 13-bit codes -> 256x256 pixels) unless the image VQ
checkpoint's `config.json` states its own (`ch`, `ch_mult`, `num_res_blocks`,
`z_channels`, `resolution`: a tiny test checkpoint does).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MagvitConfig:
    """`VQGANDecoder`'s arguments (MAGVITv2's defaults)."""

    ch: int = 128
    """Base channels (a multiple of 32: GroupNorm's groups)."""
    ch_mult: tuple[int, ...] = field(default=(1, 1, 2, 2, 4))
    """Channel multipliers per resolution level."""
    num_res_blocks: tuple[int, ...] = field(default=(4, 4, 3, 4, 3))
    """ResNet blocks per level."""
    z_channels: int = 13
    """Bits per code (the codebook has 2**z_channels codes)."""
    resolution: int = 256
    """Output pixels a side."""
    out_ch: int = 3
    """Output channels (RGB)."""

    def __post_init__(self) -> None:
        if len(self.ch_mult) != len(self.num_res_blocks):
            raise ValueError("num_res_blocks: needs one entry per ch_mult level")
        if self.ch % 32:
            raise ValueError(f"ch: {self.ch} is no multiple of 32 (GroupNorm groups)")

    @property
    def grid(self) -> int:
        """Codes a side."""
        return self.resolution // 2 ** (len(self.ch_mult) - 1)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> MagvitConfig:
        known = {f.name for f in fields(cls)}
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        return cls(**kw)


def _norm(channels: int, dtype: torch.dtype) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True, dtype=dtype)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(cin, dtype), _norm(cout, dtype)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, dtype=dtype)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, dtype=dtype)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1, dtype=dtype) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = _norm(channels, dtype)
        self.q, self.k, self.v, self.proj_out = (
            nn.Conv2d(channels, channels, 1, dtype=dtype) for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        b, c, hh, ww = x.shape
        q = self.q(h).reshape(b, c, hh * ww).permute(0, 2, 1)
        k = self.k(h).reshape(b, c, hh * ww)
        w = torch.softmax(torch.bmm(q, k) * (int(c) ** -0.5), dim=2)
        v = self.v(h).reshape(b, c, hh * ww)
        out = torch.bmm(v, w.permute(0, 2, 1)).reshape(b, c, hh, ww)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class _Mid(nn.Module):
    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, dtype)
        self.attn_1 = AttnBlock(channels, dtype)
        self.block_2 = ResnetBlock(channels, channels, dtype)


class _Level(nn.Module):
    def __init__(self, blocks: list[ResnetBlock], upsample: Upsample | None) -> None:
        super().__init__()
        self.block = nn.ModuleList(blocks)
        self.attn = nn.ModuleList()  # MAGVITv2's attn_resolutions [5] never match a level
        self.upsample = upsample


class VQGANDecoder(nn.Module):
    def __init__(self, cfg: MagvitConfig, dtype: torch.dtype) -> None:
        super().__init__()
        levels = len(cfg.ch_mult)
        block_in = cfg.ch * cfg.ch_mult[-1]
        self.post_quant_conv = nn.Conv2d(cfg.z_channels, cfg.z_channels, 1, dtype=dtype)
        self.conv_in = nn.Conv2d(cfg.z_channels, block_in, 3, padding=1, dtype=dtype)
        self.mid = _Mid(block_in, dtype)
        up: list[_Level] = []
        for i in reversed(range(levels)):
            out = cfg.ch * cfg.ch_mult[i]
            blocks = []
            for _ in range(cfg.num_res_blocks[i]):
                blocks.append(ResnetBlock(block_in, out, dtype))
                block_in = out
            up.insert(0, _Level(blocks, Upsample(block_in, dtype) if i != 0 else None))
        self.up = nn.ModuleList(up)
        self.norm_out = _norm(block_in, dtype)
        self.conv_out = nn.Conv2d(block_in, cfg.out_ch, 3, padding=1, dtype=dtype)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(self.post_quant_conv(z))
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(self.up):
            for block in level.block:
                h = block(h)
            if level.upsample is not None:
                h = level.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


def code_bits(codes: torch.Tensor, bits: int, grid: int, dtype: torch.dtype) -> torch.Tensor:
    """`[n]` codes -> `[1, bits, grid, grid]` +-1 (LFQ's codebook entries, MSB first)."""
    shifts = torch.arange(bits - 1, -1, -1, dtype=torch.long)
    binary = (codes.long()[:, None] >> shifts) & 1
    return (binary.to(dtype) * 2 - 1).view(1, grid, grid, bits).permute(0, 3, 1, 2)


def to_pixels(decoded: torch.Tensor) -> torch.Tensor:
    """`[1, 3, H, W]` in [-1, 1] -> `[H, W, 3]` uint8 (Show-o's post-processing)."""
    image = torch.clamp((decoded.float() + 1.0) / 2.0, 0.0, 1.0) * 255.0
    return image[0].permute(1, 2, 0).to(torch.uint8)
