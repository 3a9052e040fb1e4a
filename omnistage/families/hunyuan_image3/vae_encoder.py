"""The encoder of HunyuanImage-3's VAE (`AutoencoderKLConv3D`, checkpoint names
`vae.encoder.*`): images [B, 3, H, W] in [-1, 1] -> scaled latents [B, C, H/16, W/16],
what the reference puts in the context for an input image (the `vae` half of its joint
image, patch-embedded at t = 0).

Written after the reference's `Encoder` (`hunyuan_image_3/autoencoder_kl_3d.py`): the
image repeated to `ffactor_temporal` frames, 3-D convolutions, per level
`layers_per_block` residual blocks and, on the first log2(ffactor_spatial) levels, a
space-to-channel downsampling whose shortcut averages channel groups (`DownsampleDCAE`;
also in time on the last log2(ffactor_temporal) of those), the middle (two residual
blocks around one self-attention block), then GroupNorm, swish and the output
convolution plus a channel-group-mean shortcut: the posterior's mean and log-variance.

The latents are the posterior's **mean**, shifted and scaled (`- shift_factor`,
`* scaling_factor`) as the reference's `vae_encode` does; the reference draws a sample
of the posterior there (unseeded), which differs from the mean by its standard
deviation. Tiling and slicing are not built.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.hunyuan_image3.vae_decoder import AttnBlock, ResnetBlock, _conv, _norm
from omnistage.families.hunyuan_image3.weights import load_part


class DownsampleDCAE(nn.Module):
    def __init__(self, n_in: int, n_out: int, temporal: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.r1 = 2 if temporal else 1
        factor = self.r1 * 4
        if n_out % factor:
            raise ValueError("vae.block_out_channels: a downsampling level's width must divide")
        self.conv = _conv(n_in, n_out // factor, 3, dtype)
        self.group = factor * n_in // n_out

    def _unshuffle(self, x: torch.Tensor) -> torch.Tensor:
        """b c (f r1) (h r2) (w r3) -> b (r1 r2 r3 c) f h w."""
        b, c, f, h, w = x.shape
        x = x.reshape(b, c, f // self.r1, self.r1, h // 2, 2, w // 2, 2)
        return x.permute(0, 3, 5, 7, 1, 2, 4, 6).reshape(b, -1, f // self.r1, h // 2, w // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._unshuffle(self.conv(x))
        shortcut = self._unshuffle(x)
        b, _, f, hh, ww = shortcut.shape
        return h + shortcut.view(b, h.shape[1], self.group, f, hh, ww).mean(dim=2)


class _Level(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.ModuleList()


class VaeEncoder(nn.Module):
    """`vae.encoder` of the checkpoint, built from its `vae` config."""

    def __init__(self, vae: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        z, channels = int(vae["latent_channels"]), list(vae["block_out_channels"])
        spatial, temporal = int(vae["ffactor_spatial"]), int(vae["ffactor_temporal"])
        if channels[-1] % (2 * z) or not vae.get("downsample_match_channel", True):
            raise ValueError("vae.block_out_channels: the last must be a multiple of 2 * latents")
        self.z, self.temporal, self.last = z, temporal, channels[-1]
        self.scaling = vae.get("scaling_factor") or None
        self.shift = vae.get("shift_factor") or None
        self.conv_in = _conv(int(vae.get("in_channels", 3)), channels[0], 3, dtype)
        self.down = nn.ModuleList()
        n_in = channels[0]
        for level, n_out in enumerate(channels):
            down = _Level()
            for _ in range(int(vae["layers_per_block"])):
                down.block.append(ResnetBlock(n_in, n_out, dtype))
                n_in = n_out
            if level < math.log2(spatial):
                in_time = level >= math.log2(spatial // temporal)
                down.downsample = DownsampleDCAE(n_in, channels[level + 1], in_time, dtype)
                n_in = channels[level + 1]
            self.down.append(down)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(n_in, n_in, dtype)
        self.mid.attn_1 = AttnBlock(n_in, dtype)
        self.mid.block_2 = ResnetBlock(n_in, n_in, dtype)
        self.norm_out = _norm(n_in, dtype)
        self.conv_out = _conv(n_in, 2 * z, 3, dtype)
        self.requires_grad_(False)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Load `vae.encoder.*` from checkpoint `weights`; ValueError naming a missing or
        misshapen tensor."""
        load_part(self, weights, "vae.encoder.", "VAE")

    def moments(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] -> [B, 2C, h, w]: the posterior's mean, then its log-variance."""
        x = images.to(self.conv_in.weight.dtype)[:, :, None].expand(-1, -1, self.temporal, -1, -1)
        h = self.conv_in(x)
        for down in self.down:
            for block in down.block:
                h = block(h)
            if hasattr(down, "downsample"):
                h = down.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        b, _, f, hh, ww = h.shape
        shortcut = h.view(b, 2 * self.z, self.last // (2 * self.z), f, hh, ww).mean(dim=2)
        h = self.conv_out(F.silu(self.norm_out(h))) + shortcut
        return h[:, :, 0]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """[B, 3, H, W] in [-1, 1] -> [B, C, H/16, W/16] latents as the image head reads them."""
        latents = self.moments(images)[:, : self.z]
        if self.shift:
            latents = latents - self.shift
        if self.scaling:
            latents = latents * self.scaling
        return latents
