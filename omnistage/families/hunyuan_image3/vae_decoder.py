"""The decoder of HunyuanImage-3's VAE (`AutoencoderKLConv3D`, checkpoint names `vae.decoder.*`):
latents [B, C, h, w] -> images [B, 3, 16h, 16w] in [-1, 1].

Written after the reference's `Decoder` (`hunyuan_image_3/autoencoder_kl_3d.py`): 3-D
convolutions over (frames, height, width), a middle of two residual blocks around one
single-head self-attention block, then per level `layers_per_block + 1` residual
blocks and, on the first log2(ffactor_spatial) levels, a pixel-shuffle upsampling
whose shortcut repeats channels (`UpsampleDCAE`; also in time on the first
log2(ffactor_temporal) levels), then GroupNorm, swish and the output convolution.
An image is one frame; the reference keeps the last decoded frame. The latents are
first unscaled (`/ scaling_factor`, `+ shift_factor`) as its pipeline does. The
reference's chunked `Conv3d` (for inputs over 2 GiB) and tiling are not needed at
the sizes served here and not built.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.hunyuan_image3.frame_conv import FrameConv3d
from omnistage.families.hunyuan_image3.weights import load_part


def _norm(channels: int, dtype: torch.dtype) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, dtype=dtype)


def _conv(n_in: int, n_out: int, kernel: int, dtype: torch.dtype) -> nn.Conv3d:
    return FrameConv3d(n_in, n_out, kernel, dtype)


class ResnetBlock(nn.Module):
    def __init__(self, n_in: int, n_out: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1, self.conv1 = _norm(n_in, dtype), _conv(n_in, n_out, 3, dtype)
        self.norm2, self.conv2 = _norm(n_out, dtype), _conv(n_out, n_out, 3, dtype)
        self.nin_shortcut = _conv(n_in, n_out, 1, dtype) if n_in != n_out else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, channels: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = _norm(channels, dtype)
        self.q, self.k, self.v = (_conv(channels, channels, 1, dtype) for _ in range(3))
        self.proj_out = _conv(channels, channels, 1, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, f, h, w = x.shape
        y = self.norm(x)
        q, k, v = (
            m(y).reshape(b, 1, c, f * h * w).transpose(2, 3) for m in (self.q, self.k, self.v)
        )
        out = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, f, h, w))


class UpsampleDCAE(nn.Module):
    def __init__(self, n_in: int, n_out: int, temporal: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.r1 = 2 if temporal else 1
        factor = self.r1 * 4
        self.conv = _conv(n_in, n_out * factor, 3, dtype)
        self.repeats = factor * n_out // n_in

    def _shuffle(self, x: torch.Tensor) -> torch.Tensor:
        """b (r1 r2 r3 c) f h w -> b c (f r1) (h r2) (w r3)."""
        b, _, f, h, w = x.shape
        x = x.reshape(b, self.r1, 2, 2, -1, f, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
        return x.reshape(b, -1, f * self.r1, h * 2, w * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x.repeat_interleave(self.repeats, dim=1)
        return self._shuffle(self.conv(x)) + self._shuffle(shortcut)


class _Level(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleList()


class VaeDecoder(nn.Module):
    """`vae.decoder` of the checkpoint, built from its `vae` config."""

    def __init__(self, vae: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        z = int(vae["latent_channels"])
        channels = list(reversed(vae["block_out_channels"]))
        blocks = int(vae["layers_per_block"]) + 1
        spatial, temporal = int(vae["ffactor_spatial"]), int(vae["ffactor_temporal"])
        if channels[0] % z or not vae.get("upsample_match_channel", True):
            raise ValueError(
                "vae.block_out_channels: the first must be a multiple of latent_channels"
            )
        self.z, self.first = z, channels[0]
        self.scaling = vae.get("scaling_factor") or None
        self.shift = vae.get("shift_factor") or None
        self.conv_in = _conv(z, channels[0], 3, dtype)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(channels[0], channels[0], dtype)
        self.mid.attn_1 = AttnBlock(channels[0], dtype)
        self.mid.block_2 = ResnetBlock(channels[0], channels[0], dtype)
        self.up = nn.ModuleList()
        n_in = channels[0]
        for level, n_out in enumerate(channels):
            up = _Level()
            for _ in range(blocks):
                up.block.append(ResnetBlock(n_in, n_out, dtype))
                n_in = n_out
            if level < math.log2(spatial) or level < math.log2(temporal):
                nxt = channels[level + 1]
                up.upsample = UpsampleDCAE(n_in, nxt, level < math.log2(temporal), dtype)
                n_in = nxt
            self.up.append(up)
        self.norm_out = _norm(n_in, dtype)
        self.conv_out = _conv(n_in, int(vae["out_channels"]), 3, dtype)
        self.requires_grad_(False)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Load `vae.decoder.*` from checkpoint `weights`; ValueError naming a missing or
        misshapen tensor."""
        load_part(self, weights, "vae.decoder.", "VAE")

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """[B, C, h, w] scaled latents -> [B, 3, H, W] images in about [-1, 1]."""
        z = latents.to(self.conv_in.weight.dtype)
        if self.scaling:
            z = z / self.scaling
        if self.shift:
            z = z + self.shift
        z = z[:, :, None]
        h = self.conv_in(z) + z.repeat_interleave(self.first // self.z, dim=1)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for up in self.up:
            for block in up.block:
                h = block(h)
            if hasattr(up, "upsample"):
                h = up.upsample(h)
        h = self.conv_out(F.silu(self.norm_out(h)))
        return h[:, :, -1]
