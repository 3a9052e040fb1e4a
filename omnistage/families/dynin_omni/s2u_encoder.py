"""The SPIRAL2 encoder of EMOVA's speech-to-unit tokenizer (the vendored NeMo's
`parts/spec2vec.FeatureEncoder` as `ST2VecEncoder.feature_encoder`), inference only.

Blocks of `ConvNormAct` layers (a 1-d convolution with TensorFlow-style "same" padding,
LayerNorm over channels, ReLU or none) each followed by a wav2vec-style transformer
(`parts/wav2vec.TransformerEncoder`: a grouped positional convolution with weight norm,
its last frame dropped for an even kernel, GELU, added to the input; pre-LayerNorm layers
of fairseq multi-head attention and a GELU MLP; a final LayerNorm). Lengths shrink by
ceil(len / stride) at each strided convolution; frames past a length are zeroed before a
convolution wider than one and masked out of attention as keys.

One subtlety copied exactly: the reference picks a strided convolution's padding by the
parity of `x.size(-2)` -- for a [B, C, T] input that is the channel count, not the time
length -- so with an even channel count a stride-2 kernel of 5 pads 1 on the left and 2
on the right, with an odd one 2 and 2.

Parameter names are the checkpoint's under `encoder.feature_encoder.`:
`block_modules.{i}.conv.conv.{weight,bias}`, `block_modules.{i}.norm.{weight,bias}` for a
convolution, and for a transformer `block_modules.{i}.pos_conv.0.{bias,weight_g,weight_v}`,
`layers.{j}.self_attn.{q,k,v,out}_proj`, `layers.{j}.{self_attn_layer_norm,fc1,fc2,
final_layer_norm}`, `layer_norm`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ConvSpec:
    filters: int
    """Output channels."""
    kernel_size: int
    """Odd kernel width."""
    stride: int
    """1 or 2."""
    relu: bool
    """ReLU after the LayerNorm (else no activation)."""

    def __post_init__(self) -> None:
        if self.kernel_size % 2 != 1:
            raise ValueError(f"kernel_size: must be odd, got {self.kernel_size}")
        if self.stride not in (1, 2):
            raise ValueError(f"stride: must be 1 or 2, got {self.stride}")


@dataclass(frozen=True)
class TransformerSpec:
    layers: int
    """Number of transformer layers."""
    dim: int
    """Model width (the preceding convolution's filters)."""
    ffn_dim: int
    """MLP width."""
    heads: int
    """Attention heads."""
    conv_pos: int = 128
    """Positional convolution kernel."""
    conv_pos_groups: int = 16
    """Positional convolution groups."""


class ConvNormAct(nn.Module):
    def __init__(self, in_channels: int, spec: ConvSpec) -> None:
        super().__init__()
        self.conv = nn.Module()
        self.conv.conv = nn.Conv1d(in_channels, spec.filters, spec.kernel_size, spec.stride)
        self.norm = nn.LayerNorm(spec.filters, eps=1e-5)
        self.in_channels, self.spec = in_channels, spec

    def _pad(self) -> tuple[int, int]:
        half = self.spec.kernel_size // 2
        if self.spec.stride == 2 and self.in_channels % 2 == 0:
            return half - 1, half
        return half, half

    def forward(self, x: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.spec.kernel_size > 1:
            x = x.masked_fill(_pad_mask(length, x.shape[2]).unsqueeze(1), 0.0)
            x = F.pad(x, self._pad())
        out = self.conv.conv(x)
        if self.spec.stride > 1:
            length = (length + self.spec.stride - 1) // self.spec.stride
        out = self.norm(out.transpose(-1, -2)).transpose(-1, -2)
        return (torch.relu(out) if self.spec.relu else out), length


class SelfAttention(nn.Module):
    """fairseq's `MultiheadAttention` for self-attention with a key padding mask."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.v_proj, self.out_proj = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.q_proj(x) * self.head_dim**-0.5

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        scores = split(q) @ split(self.k_proj(x)).transpose(-1, -2)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).to(x.dtype)
        out = (probs @ split(self.v_proj(x))).transpose(1, 2).reshape(b, t, d)
        return self.out_proj(out)


class TransformerLayer(nn.Module):
    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        self.self_attn = SelfAttention(spec.dim, spec.heads)
        self.self_attn_layer_norm = nn.LayerNorm(spec.dim)
        self.fc1, self.fc2 = nn.Linear(spec.dim, spec.ffn_dim), nn.Linear(spec.ffn_dim, spec.dim)
        self.final_layer_norm = nn.LayerNorm(spec.dim)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), pad)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class TransformerBlock(nn.Module):
    """wav2vec `TransformerEncoder` with `layer_norm_first` (the configured SPIRAL2)."""

    def __init__(self, spec: TransformerSpec) -> None:
        super().__init__()
        conv = nn.Conv1d(
            spec.dim,
            spec.dim,
            spec.conv_pos,
            padding=spec.conv_pos // 2,
            groups=spec.conv_pos_groups,
        )
        self.pos_conv = nn.Sequential(conv)
        self.remove_last = spec.conv_pos % 2 == 0
        self.layers = nn.ModuleList(TransformerLayer(spec) for _ in range(spec.layers))
        self.layer_norm = nn.LayerNorm(spec.dim)

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = x.masked_fill(pad.unsqueeze(-1), 0.0)
        pos = self.pos_conv(x.transpose(1, 2))
        if self.remove_last:
            pos = pos[:, :, :-1]
        x = x + F.gelu(pos).transpose(1, 2)
        for layer in self.layers:
            x = layer(x, pad)
        return self.layer_norm(x)


def _pad_mask(length: torch.Tensor, max_len: int) -> torch.Tensor:
    return torch.arange(max_len, device=length.device) >= length.unsqueeze(-1)


class FeatureEncoder(nn.Module):
    """Features [B, feat_in, T] and lengths -> encodings [B, T', D] and lengths."""

    def __init__(self, feat_in: int, blocks: list[tuple[list[ConvSpec], TransformerSpec]]) -> None:
        super().__init__()
        modules: list[nn.Module] = []
        channels = feat_in
        for convs, transformer in blocks:
            for spec in convs:
                modules.append(ConvNormAct(channels, spec))
                channels = spec.filters
            if transformer.dim != channels:
                raise ValueError(f"transformer dim {transformer.dim} != conv filters {channels}")
            modules.append(TransformerBlock(transformer))
        self.block_modules = nn.ModuleList(modules)
        self.output_dim = channels

    def forward(self, x: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for module in self.block_modules:
            if isinstance(module, ConvNormAct):
                x, length = module(x, length)
            else:
                pad = _pad_mask(length, x.shape[2])
                x = module(x.transpose(1, 2), pad).transpose(1, 2)
        return x.transpose(1, 2), length
