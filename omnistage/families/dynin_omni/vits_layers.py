"""The VITS building blocks of EMOVA's unit-to-speech decoder (`speech_tokenization/UVITS`
of the EMOVA speech tokenizer): the unit encoder's transformer with windowed relative
positions, its channel LayerNorm, the dilated depth-separable convolutions of the duration
predictor and the WaveNet stack of the coupling flows. Parameter names are UVITS's
(`attn_layers.N.conv_q`, `emb_rel_k`, `norm_layers_1.N.GAMMA`, `convs_sep`, `in_layers`,
…); weight-normed convolutions hold their fused weight (see `emova_u2s.fuse_weight_norm`).

Inference only, one unpadded sequence at a time (batch 1, every position valid), so the
reference's sequence masks are all ones and left out.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class ChannelNorm(nn.Module):
    """UVITS `LayerNorm`: layer norm over the channels of a [b, c, t] tensor."""

    def __init__(self, channels: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.GAMMA = nn.Parameter(torch.ones(channels))
        self.BETA = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x.transpose(1, -1), (x.shape[1],), self.GAMMA, self.BETA, self.eps)
        return y.transpose(1, -1)


class RelativeAttention(nn.Module):
    """Self-attention with relative-position key and value embeddings shared by the heads
    (`window_size` positions either side)."""

    def __init__(self, channels: int, n_heads: int, window_size: int) -> None:
        super().__init__()
        self.n_heads, self.k = n_heads, channels // n_heads
        self.window = window_size
        self.conv_q = nn.Conv1d(channels, channels, 1)
        self.conv_k = nn.Conv1d(channels, channels, 1)
        self.conv_v = nn.Conv1d(channels, channels, 1)
        self.conv_o = nn.Conv1d(channels, channels, 1)
        self.emb_rel_k = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k))
        self.emb_rel_v = nn.Parameter(torch.zeros(1, 2 * window_size + 1, self.k))

    def _relative(self, table: torch.Tensor, length: int) -> torch.Tensor:
        """The 2*length-1 relative embeddings (-(length-1) .. length-1), zeros past the window."""
        pad = max(length - (self.window + 1), 0)
        start = max((self.window + 1) - length, 0)
        table = F.pad(table, (0, 0, pad, pad)) if pad else table
        return table[:, start : start + 2 * length - 1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d, t = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, self.n_heads, self.k, t).transpose(2, 3)

        q = heads(self.conv_q(x)) / math.sqrt(self.k)
        k, v = heads(self.conv_k(x)), heads(self.conv_v(x))
        scores = q @ k.transpose(-2, -1)
        rel_logits = q @ self._relative(self.emb_rel_k, t).unsqueeze(0).transpose(-2, -1)
        scores = scores + _relative_to_absolute(rel_logits)
        p = F.softmax(scores, dim=-1)
        out = p @ v + _absolute_to_relative(p) @ self._relative(self.emb_rel_v, t).unsqueeze(0)
        return self.conv_o(out.transpose(2, 3).contiguous().view(b, d, t))


def _relative_to_absolute(x: torch.Tensor) -> torch.Tensor:
    """[b, h, l, 2l-1] logits by relative position -> [b, h, l, l] by key position."""
    b, h, length, _ = x.shape
    flat = F.pad(x, (0, 1)).view(b, h, length * 2 * length)
    flat = F.pad(flat, (0, length - 1))
    return flat.view(b, h, length + 1, 2 * length - 1)[:, :, :length, length - 1 :]


def _absolute_to_relative(x: torch.Tensor) -> torch.Tensor:
    """[b, h, l, l] weights by key position -> [b, h, l, 2l-1] by relative position."""
    b, h, length, _ = x.shape
    flat = F.pad(x, (0, length - 1)).view(b, h, length**2 + length * (length - 1))
    flat = F.pad(flat, (length, 0))
    return flat.view(b, h, length, 2 * length)[:, :, :, 1:]


class FeedForward(nn.Module):
    """Two 'same'-padded convolutions with a ReLU between (UVITS `FFN`)."""

    def __init__(self, channels: int, filter_channels: int, kernel_size: int) -> None:
        super().__init__()
        self.pad = ((kernel_size - 1) // 2, kernel_size // 2)
        self.conv_1 = nn.Conv1d(channels, filter_channels, kernel_size)
        self.conv_2 = nn.Conv1d(filter_channels, channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_2(F.pad(torch.relu(self.conv_1(F.pad(x, self.pad))), self.pad))


class Encoder(nn.Module):
    """Post-norm transformer encoder of the unit encoder (UVITS `attentions.Encoder`)."""

    def __init__(
        self, channels: int, filter_channels: int, n_heads: int, n_layers: int, kernel_size: int
    ) -> None:
        super().__init__()
        self.attn_layers = nn.ModuleList(
            RelativeAttention(channels, n_heads, 4) for _ in range(n_layers)
        )
        self.norm_layers_1 = nn.ModuleList(ChannelNorm(channels) for _ in range(n_layers))
        self.ffn_layers = nn.ModuleList(
            FeedForward(channels, filter_channels, kernel_size) for _ in range(n_layers)
        )
        self.norm_layers_2 = nn.ModuleList(ChannelNorm(channels) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for attn, norm1, ffn, norm2 in zip(
            self.attn_layers, self.norm_layers_1, self.ffn_layers, self.norm_layers_2, strict=True
        ):
            x = norm1(x + attn(x))
            x = norm2(x + ffn(x))
        return x


class DDSConv(nn.Module):
    """Dilated depth-separable convolutions with residuals (the duration predictor's)."""

    def __init__(self, channels: int, kernel_size: int, n_layers: int) -> None:
        super().__init__()
        self.convs_sep, self.convs_1x1 = nn.ModuleList(), nn.ModuleList()
        self.norms_1, self.norms_2 = nn.ModuleList(), nn.ModuleList()
        for i in range(n_layers):
            dilation = kernel_size**i
            self.convs_sep.append(
                nn.Conv1d(
                    channels,
                    channels,
                    kernel_size,
                    groups=channels,
                    dilation=dilation,
                    padding=(kernel_size * dilation - dilation) // 2,
                )
            )
            self.convs_1x1.append(nn.Conv1d(channels, channels, 1))
            self.norms_1.append(ChannelNorm(channels))
            self.norms_2.append(ChannelNorm(channels))

    def forward(self, x: torch.Tensor, g: torch.Tensor | None = None) -> torch.Tensor:
        if g is not None:
            x = x + g
        for sep, norm1, one, norm2 in zip(
            self.convs_sep, self.norms_1, self.convs_1x1, self.norms_2, strict=True
        ):
            x = x + F.gelu(norm2(one(F.gelu(norm1(sep(x))))))
        return x


class WaveNet(nn.Module):
    """Gated dilated convolutions conditioned on the style (UVITS `WN`)."""

    def __init__(
        self, hidden: int, kernel_size: int, dilation_rate: int, n_layers: int, gin: int
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.cond_layer = nn.Conv1d(gin, 2 * hidden * n_layers, 1)
        self.in_layers, self.res_skip_layers = nn.ModuleList(), nn.ModuleList()
        for i in range(n_layers):
            dilation = dilation_rate**i
            self.in_layers.append(
                nn.Conv1d(
                    hidden,
                    2 * hidden,
                    kernel_size,
                    dilation=dilation,
                    padding=(kernel_size * dilation - dilation) // 2,
                )
            )
            out = 2 * hidden if i < n_layers - 1 else hidden
            self.res_skip_layers.append(nn.Conv1d(hidden, out, 1))

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        output = torch.zeros_like(x)
        g = self.cond_layer(g)
        h, last = self.hidden, len(self.in_layers) - 1
        for i, (in_layer, res_skip) in enumerate(
            zip(self.in_layers, self.res_skip_layers, strict=True)
        ):
            a = in_layer(x) + g[:, i * 2 * h : (i + 1) * 2 * h]
            acts = res_skip(torch.tanh(a[:, :h]) * torch.sigmoid(a[:, h:]))
            if i < last:
                x = x + acts[:, :h]
                output = output + acts[:, h:]
            else:
                output = output + acts
        return output
