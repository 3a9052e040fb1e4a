"""HunyuanImage-3's image head: what turns VAE latents into decoder input rows and decoder
output rows back into a velocity, named as the checkpoint names them.

- `timestep_emb`: the diffusion time as the `<timestep>` token's input row;
- `time_embed` + `patch_embed` (a conv and a time-conditioned residual block, the
  reference's `UNetDown` at `patch_size` 1): latents [B, C, h, w] -> [B, h*w, hidden];
- `time_embed_2` + `final_layer` (`UNetUp` with its output norm): the decoder's image
  rows -> the predicted velocity [B, C, h, w].

Written after the reference's `TimestepEmbedder`, `ResBlock`, `UNetDown` and `UNetUp`
(`hunyuan_image_3/hunyuan.py`); only `patch_size` 1 (the released checkpoint's) is
built. Sinusoidal frequencies are computed in float32 as the reference does, then
cast to the module's dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[N] times -> [N, dim]: cos then sin of t * max_period^(-i / half)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half
    )
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden: int, dtype: torch.dtype, frequency_size: int = 256) -> None:
        super().__init__()
        self.frequency_size = frequency_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_size, hidden, dtype=dtype),
            nn.GELU(),
            nn.Linear(hidden, hidden, dtype=dtype),
        )

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        freqs = timestep_embedding(t, self.frequency_size).to(self.mlp[0].weight.dtype)
        return self.mlp(freqs)


def _group_norm(channels: int, dtype: torch.dtype) -> nn.GroupNorm:
    return nn.GroupNorm(32, channels, dtype=dtype)


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv, then a time-conditioned GroupNorm (scale, shift), SiLU, conv,
    plus a skip (identity or 1x1 conv)."""

    def __init__(self, n_in: int, emb: int, n_out: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_layers = nn.Sequential(
            _group_norm(n_in, dtype), nn.SiLU(), nn.Conv2d(n_in, n_out, 3, padding=1, dtype=dtype)
        )
        self.emb_layers = nn.Sequential(nn.SiLU(), nn.Linear(emb, 2 * n_out, dtype=dtype))
        self.out_layers = nn.Sequential(
            _group_norm(n_out, dtype),
            nn.SiLU(),
            nn.Dropout(0.0),
            nn.Conv2d(n_out, n_out, 3, padding=1, dtype=dtype),
        )
        self.skip_connection: nn.Module = (
            nn.Identity() if n_in == n_out else nn.Conv2d(n_in, n_out, 1, dtype=dtype)
        )

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        h = self.in_layers(x)
        scale, shift = self.emb_layers(emb)[..., None, None].chunk(2, dim=1)
        h = self.out_layers[0](h) * (1.0 + scale) + shift
        return self.skip_connection(x) + self.out_layers[1:](h)


class PatchEmbed(nn.Module):
    """`patch_embed` (`UNetDown`, patch 1): latents [B, C, h, w] -> rows [B, h*w, hidden]."""

    def __init__(self, latent: int, hidden_channels: int, hidden: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = nn.ModuleList(
            [
                nn.Conv2d(latent, hidden_channels, 3, padding=1, dtype=dtype),
                ResBlock(hidden_channels, hidden, hidden, dtype),
            ]
        )

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        x = self.model[1](self.model[0](x), t_emb)
        return x.flatten(2).transpose(1, 2)


class FinalLayer(nn.Module):
    """`final_layer` (`UNetUp`, patch 1, output norm): rows [B, h*w, hidden] -> [B, C, h, w]."""

    def __init__(self, hidden: int, hidden_channels: int, latent: int, dtype: torch.dtype) -> None:
        super().__init__()
        out = nn.Sequential(
            _group_norm(hidden_channels, dtype),
            nn.SiLU(),
            nn.Conv2d(hidden_channels, latent, 3, padding=1, dtype=dtype),
        )
        self.model = nn.ModuleList([ResBlock(hidden, hidden, hidden_channels, dtype), out])

    def forward(self, rows: torch.Tensor, t_emb: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = rows.transpose(1, 2).reshape(rows.shape[0], rows.shape[2], h, w)
        return self.model[1](self.model[0](x, t_emb))


class ImageHead(nn.Module):
    """The four image-head modules of the checkpoint, under their checkpoint names."""

    PREFIXES = ("timestep_emb.", "time_embed.", "time_embed_2.", "patch_embed.", "final_layer.")

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        if config.patch_size != 1 or config.img_proj_type != "unet":
            raise ValueError("patch_size / img_proj_type: only 1 / 'unet' are supported")
        if not config.vae or "latent_channels" not in config.vae:
            raise ValueError("vae.latent_channels: the image head needs the VAE's latent width")
        hidden, inner = config.hidden_size, config.patch_embed_hidden_dim
        latent = int(config.vae["latent_channels"])
        self.timestep_emb = TimestepEmbedder(hidden, dtype)
        self.time_embed = TimestepEmbedder(hidden, dtype)
        self.time_embed_2 = TimestepEmbedder(hidden, dtype)
        self.patch_embed = PatchEmbed(latent, inner, hidden, dtype)
        self.final_layer = FinalLayer(hidden, inner, latent, dtype)
        self.requires_grad_(False)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """Load the head's tensors (checkpoint names) from `weights`; ValueError naming a
        missing or misshapen one."""
        params = dict(self.named_parameters())
        for name, param in params.items():
            if name not in weights:
                raise ValueError(f"checkpoint: image-head weight {name!r} is missing")
            if weights[name].shape != param.shape:
                raise ValueError(f"checkpoint: {name!r} has shape {tuple(weights[name].shape)}")
            param.copy_(weights[name].to(param.dtype))
