"""The FLUX autoencoder Bagel draws with, under the names of its `ae.safetensors`.

Bagel ships FLUX's VAE in FLUX's own parameter names (`decoder.up.3.block.0.norm1`,
`decoder.mid.attn_1.q`, …; `modeling/autoencoder.py` of the reference), not in
diffusers' layout, so the modules here follow those names and that structure:
ResNet blocks of two GroupNorm-SiLU-conv layers, one single-head attention block
in the middle, nearest-neighbour upsampling (decoder) and asymmetrically padded
stride-2 convs (encoder). `decode` undoes the latent normalisation
(`z / scale_factor + shift_factor`) first, as the reference's `AutoEncoder.decode`.
`encode` is the reference's too: the encoder, a sample of its diagonal Gaussian
posterior (with noise the caller draws), then the normalisation; image editing puts
an input image into the context through it.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.bagel.config import AE_WEIGHTS, AutoEncoderParams


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class ResnetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm1 = _norm(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = _norm(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        if c_in != c_out:
            self.nin_shortcut = nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        skip = self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x
        return skip + h


class AttnBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.norm = _norm(c)
        self.q, self.k, self.v = (nn.Conv2d(c, c, 1) for _ in range(3))
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (m(n).reshape(b, 1, c, h * w).transpose(2, 3) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v).transpose(2, 3).reshape(b, c, h, w)
        return x + self.proj_out(out)


class Upsample(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Downsample(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


def _middle(c: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1, mid.attn_1, mid.block_2 = ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)
    return mid


def _level(blocks: list[nn.Module]) -> nn.Module:
    level = nn.Module()
    level.block = nn.ModuleList(blocks)
    level.attn = nn.ModuleList()
    return level


class Encoder(nn.Module):
    def __init__(self, p: AutoEncoderParams) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(p.in_channels, p.ch, 3, padding=1)
        self.down = nn.ModuleList()
        c = p.ch
        for i, mult in enumerate(p.ch_mult):
            blocks = []
            for _ in range(p.num_res_blocks):
                blocks.append(ResnetBlock(c, p.ch * mult))
                c = p.ch * mult
            level = _level(blocks)
            if i != len(p.ch_mult) - 1:
                level.downsample = Downsample(c)
            self.down.append(level)
        self.mid = _middle(c)
        self.norm_out = _norm(c)
        self.conv_out = nn.Conv2d(c, 2 * p.z_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pixels `[B, 3, H, W]` -> the posterior's mean and log-variance `[B, 2 z, h, w]`."""
        h = self.conv_in(x)
        for i, level in enumerate(self.down):
            for block in level.block:
                h = block(h)
            if i != len(self.down) - 1:
                h = level.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, p: AutoEncoderParams) -> None:
        super().__init__()
        c = p.ch * p.ch_mult[-1]
        self.conv_in = nn.Conv2d(p.z_channels, c, 3, padding=1)
        self.mid = _middle(c)
        levels: list[nn.Module] = []
        for i in reversed(range(len(p.ch_mult))):
            blocks = []
            for _ in range(p.num_res_blocks + 1):
                blocks.append(ResnetBlock(c, p.ch * p.ch_mult[i]))
                c = p.ch * p.ch_mult[i]
            level = _level(blocks)
            if i != 0:
                level.upsample = Upsample(c)
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)
        self.norm_out = _norm(c)
        self.conv_out = nn.Conv2d(c, p.out_ch, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for i in reversed(range(len(self.up))):
            for block in self.up[i].block:
                h = block(h)
            if i != 0:
                h = self.up[i].upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class AutoEncoder(nn.Module):
    def __init__(self, params: AutoEncoderParams) -> None:
        super().__init__()
        self.params = params
        self.encoder = Encoder(params)
        self.decoder = Decoder(params)

    @classmethod
    def load(cls, path: str | Path, params: AutoEncoderParams, dtype: torch.dtype) -> AutoEncoder:
        """The autoencoder of checkpoint folder `path` (`ae.safetensors`, complete)."""
        from safetensors.torch import load_file

        model = cls(params)
        weights = load_file(str(Path(path) / AE_WEIGHTS))
        result = model.load_state_dict(weights, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f"{path}/{AE_WEIGHTS}: missing {result.missing_keys[:3]}, "
                f"unknown {result.unexpected_keys[:3]}"
            )
        return model.to(dtype).eval()

    @torch.inference_mode()
    def encode(self, x: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Pixels in [-1, 1] `[B, 3, H, W]` -> normalised latents `[B, z_channels, h, w]`:
        the posterior sampled with `noise` (standard normal, the mean's shape; the
        reference draws it with `randn_like`), None: its mean; then
        `scale_factor (z - shift_factor)`, as the reference's `AutoEncoder.encode`."""
        mean, logvar = self.encoder(x).chunk(2, dim=1)
        z = mean if noise is None else mean + torch.exp(0.5 * logvar) * noise.to(mean.dtype)
        return self.params.scale_factor * (z - self.params.shift_factor)

    @torch.inference_mode()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents `[B, z_channels, h, w]` -> pixels in about [-1, 1]."""
        return self.decoder(z / self.params.scale_factor + self.params.shift_factor)
