"""The flow-matching decoder of Ming-Omni's vocoder (CosyVoice-1's `ConditionalCFM` over a
`ConditionalDecoder` U-Net), inference only.

Ported from the reference `audio_detokenizer/flow/decoder.py` and `flow_matching.py`
and the Matcha-TTS / diffusers blocks they import (`ResnetBlock1D`, `Block1D`,
`Downsample1D`, `Upsample1D`, `TimestepEmbedding`, `SinusoidalPosEmb`,
`BasicTransformerBlock` with a diffusers `Attention` and a GELU feed-forward), under the
reference's parameter names (`estimator.down_blocks.0.1.0.attn1.to_q`, ...).

One unpadded request per call: the reference's attention mask is a float 0/1 matrix
that diffusers *adds* to the scores; over a full-length request it adds 1 everywhere,
which softmax ignores, so no mask is applied here. Batching padded requests would need
the reference's exact (additive) treatment and is not done.

The Euler solver follows the reference: `t` on a cosine schedule over `n_timesteps`,
classifier-free guidance `(1 + r) v(mu, spk) - r v(0, 0)`; the starting noise is drawn
from the request's generator (the reference draws `randn_like(mu)` from the global RNG).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.ming_omni.vocoder_config import MingFlowConfig


class SinusoidalPosEmb(nn.Module):
    """Matcha's timestep sinusoid (scale 1000, sin then cos)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        emb = torch.exp(
            torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1))
        )
        emb = 1000 * t.reshape(-1).unsqueeze(1) * emb.unsqueeze(0)
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class Block1D(nn.Module):
    def __init__(self, dim: int, dim_out: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            nn.Conv1d(dim, dim_out, 3, padding=1), nn.GroupNorm(8, dim_out), nn.Mish()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ResnetBlock1D(nn.Module):
    def __init__(self, dim: int, dim_out: int, time_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_dim, dim_out))
        self.block1 = Block1D(dim, dim_out)
        self.block2 = Block1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = self.block1(x) + self.mlp(t).unsqueeze(-1)
        return self.block2(h) + self.res_conv(x)


class _Attention(nn.Module):
    """diffusers `Attention` (self, no bias on q/k/v, `to_out.0` with bias)."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (
            p(x).view(b, t, self.heads, -1).transpose(1, 2)
            for p in (self.to_q, self.to_k, self.to_v)
        )
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, -1)
        return self.to_out[0](out)


class _GELUProj(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.proj(x))


class BasicTransformerBlock(nn.Module):
    """Matcha's `BasicTransformerBlock` as the decoder builds it: layer norms, self-attn, GELU FFN."""

    def __init__(self, dim: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = _Attention(dim, heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = nn.Module()
        self.ff.net = nn.ModuleList(
            [_GELUProj(dim, 4 * dim), nn.Dropout(0.0), nn.Linear(4 * dim, dim)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn1(self.norm1(x)) + x
        return self.ff.net[2](self.ff.net[0](self.norm3(x))) + x


class _Upsample1D(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class _Downsample1D(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _level(
    c: MingFlowConfig, dim_in: int, dim: int, time_dim: int, last: nn.Module | None
) -> nn.ModuleList:
    blocks = nn.ModuleList(
        BasicTransformerBlock(dim, c.num_heads, c.attention_head_dim) for _ in range(c.n_blocks)
    )
    parts: list[nn.Module] = [ResnetBlock1D(dim_in, dim, time_dim), blocks]
    return nn.ModuleList([*parts, last] if last is not None else parts)


class ConditionalDecoder(nn.Module):
    """The U-Net estimator: v(x, mu, t, spks, cond) over [1, C, frames]."""

    def __init__(self, c: MingFlowConfig) -> None:
        super().__init__()
        channels, time_dim = c.channels, c.channels[0] * 4
        self.time_embeddings = SinusoidalPosEmb(c.estimator_in_channels)
        self.time_mlp = TimestepEmbedding(c.estimator_in_channels, time_dim)
        self.down_blocks, self.mid_blocks, self.up_blocks = (
            nn.ModuleList(),
            nn.ModuleList(),
            nn.ModuleList(),
        )
        out = c.estimator_in_channels
        for i, ch in enumerate(channels):
            last = i == len(channels) - 1
            down = nn.Conv1d(ch, ch, 3, padding=1) if last else _Downsample1D(ch)
            self.down_blocks.append(_level(c, out, ch, time_dim, down))
            out = ch
        for _ in range(c.num_mid_blocks):
            self.mid_blocks.append(_level(c, channels[-1], out, time_dim, None))
        ups = (*channels[::-1], channels[0])
        for i in range(len(ups) - 1):
            last = i == len(ups) - 2
            up = (
                nn.Conv1d(ups[i + 1], ups[i + 1], 3, padding=1) if last else _Upsample1D(ups[i + 1])
            )
            self.up_blocks.append(_level(c, ups[i] * 2, ups[i + 1], time_dim, up))
        self.final_block = Block1D(ups[-1], ups[-1])
        self.final_proj = nn.Conv1d(ups[-1], c.output_size, 1)

    @staticmethod
    def _attend(x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        x = x.transpose(1, 2).contiguous()
        for block in blocks:
            x = block(x)
        return x.transpose(1, 2).contiguous()

    def forward(
        self,
        x: torch.Tensor,
        mu: torch.Tensor,
        t: torch.Tensor,
        spks: torch.Tensor,
        cond: torch.Tensor,
    ) -> torch.Tensor:
        t = self.time_mlp(self.time_embeddings(t).to(t.dtype))
        spks = spks.unsqueeze(-1).expand(-1, -1, x.shape[-1])
        x = torch.cat([x, mu, spks, cond], dim=1)
        hiddens = []
        for resnet, blocks, downsample in self.down_blocks:
            x = self._attend(resnet(x, t), blocks)
            hiddens.append(x)
            x = downsample(x)
        for resnet, blocks in self.mid_blocks:
            x = self._attend(resnet(x, t), blocks)
        for resnet, blocks, upsample in self.up_blocks:
            skip = hiddens.pop()
            x = torch.cat([x[:, :, : skip.shape[-1]], skip], dim=1)
            x = upsample(self._attend(resnet(x, t), blocks))
        return self.final_proj(self.final_block(x))


class ConditionalCFM(nn.Module):
    """`ConditionalCFM.forward` at inference: Euler steps with classifier-free guidance."""

    def __init__(self, c: MingFlowConfig) -> None:
        super().__init__()
        self.config = c
        self.estimator = ConditionalDecoder(c)

    def time_span(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        t_span = torch.linspace(0, 1, self.config.n_timesteps + 1, device=device, dtype=dtype)
        if self.config.t_scheduler == "cosine":
            t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
        return t_span

    def forward(self, mu: torch.Tensor, spks: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """mu [1, C, frames], spks [1, C], noise like mu -> mel [1, C, frames]."""
        rate = self.config.inference_cfg_rate
        cond = torch.zeros_like(mu)
        t_span = self.time_span(mu.dtype, mu.device)
        x, t, dt = noise, t_span[0].unsqueeze(0), t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            v = self.estimator(x, mu, t, spks, cond)
            if rate > 0:
                uncond = self.estimator(x, torch.zeros_like(mu), t, torch.zeros_like(spks), cond)
                v = (1.0 + rate) * v - rate * uncond
            x, t = x + dt * v, t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
        return x
