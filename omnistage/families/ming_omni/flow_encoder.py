"""The text side of Ming-Omni's flow (CosyVoice-1's): Conformer encoder and length regulator.

Ported from the reference `audio_detokenizer/transformer/` (`ConformerEncoder` with
`input_layer: linear`, `rel_pos_espnet` positions, `rel_selfattn`, no CNN module, no
macaron feed-forward, pre-norm, SiLU) and `flow/length_regulator.py`
(`InterpolateRegulator`), inference only and one unpadded request at a time, under the
reference's parameter names (`embed.out.0`, `encoders.N.self_attn.linear_q`, ...,
`length_regulator.model.K`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def espnet_rel_positions(size: int, d_model: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 2 size - 1, d_model]: the sinusoid of relative positions size-1 down to
    -(size-1), as `EspnetRelPositionalEncoding.position_encoding` slices its table."""
    position = torch.arange(size - 1, -size, -1, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model)
    )
    pe = torch.zeros(2 * size - 1, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.unsqueeze(0).to(dtype)


class RelPositionAttention(nn.Module):
    """`RelPositionMultiHeadedAttention` (Transformer-XL biases u, v; `rel_shift`)."""

    def __init__(self, heads: int, dim: int) -> None:
        super().__init__()
        self.h, self.d_k = heads, dim // heads
        self.linear_q = nn.Linear(dim, dim)
        self.linear_k = nn.Linear(dim, dim)
        self.linear_v = nn.Linear(dim, dim)
        self.linear_out = nn.Linear(dim, dim)
        self.linear_pos = nn.Linear(dim, dim, bias=False)
        self.pos_bias_u = nn.Parameter(torch.zeros(heads, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.zeros(heads, self.d_k))

    @staticmethod
    def rel_shift(x: torch.Tensor) -> torch.Tensor:
        """[b, h, t, 2t-1] scores by relative position -> [b, h, t, t] by key index."""
        padded = torch.cat([x.new_zeros((*x.shape[:3], 1)), x], dim=-1)
        padded = padded.view(*x.shape[:2], x.size(3) + 1, x.size(2))
        return padded[:, :, 1:].view_as(x)[:, :, :, : x.size(-1) // 2 + 1]

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(pos_emb.size(0), -1, self.h, self.d_k).transpose(1, 2)
        matrix_ac = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        matrix_bd = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        if matrix_ac.shape != matrix_bd.shape:
            matrix_bd = self.rel_shift(matrix_bd)
        scores = (matrix_ac + matrix_bd) / math.sqrt(self.d_k)
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))


class FeedForward(nn.Module):
    """`PositionwiseFeedForward`: w_2(silu(w_1 x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = nn.Linear(dim, hidden)
        self.w_2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerLayer(nn.Module):
    """`ConformerEncoderLayer` without CNN module or macaron: pre-norm attention, FFN."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = RelPositionAttention(heads, dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.norm_ff = nn.LayerNorm(dim, eps=1e-5)
        self.norm_mha = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor, pos_emb: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.norm_mha(x), pos_emb)
        return x + self.feed_forward(self.norm_ff(x))


class _LinearEmbed(nn.Module):
    """`LinearNoSubsampling`: `out` = Linear, LayerNorm, Dropout (no-op at inference)."""

    def __init__(self, idim: int, odim: int) -> None:
        super().__init__()
        self.out = nn.Sequential(
            nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5), nn.Dropout(0.0)
        )


class ConformerEncoder(nn.Module):
    """The flow's text encoder: [1, T, input_size] -> [1, T, output_size]."""

    def __init__(self, input_size: int, dim: int, heads: int, hidden: int, blocks: int) -> None:
        super().__init__()
        self.dim = dim
        self.embed = _LinearEmbed(input_size, dim)
        self.encoders = nn.ModuleList(ConformerLayer(dim, heads, hidden) for _ in range(blocks))
        self.after_norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        xs = self.embed.out(xs) * math.sqrt(self.dim)
        pos_emb = espnet_rel_positions(xs.size(1), self.dim, xs.dtype).to(xs.device)
        for layer in self.encoders:
            xs = layer(xs, pos_emb)
        return self.after_norm(xs)


class InterpolateRegulator(nn.Module):
    """`InterpolateRegulator`: nearest resampling to the mel length, then per ratio
    (Conv1d k3, GroupNorm(1), Mish) and a 1x1 Conv1d; [1, T, C] -> [1, frames, C]."""

    def __init__(self, channels: int, ratios: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(ratios):
            layers += [nn.Conv1d(channels, channels, 3, 1, 1), nn.GroupNorm(1, channels), nn.Mish()]
        layers.append(nn.Conv1d(channels, channels, 1, 1))
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, frames: int) -> torch.Tensor:
        x = F.interpolate(x.transpose(1, 2).contiguous(), size=frames, mode="nearest")
        return self.model(x).transpose(1, 2).contiguous()
