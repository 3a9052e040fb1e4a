"""Covo-Audio's latent -> waveform vocoder: causal BigVGAN with anti-aliased snake-beta.

Parameter names are the reference's (`token2wav/models/latent2wav.py`,
`BigVGANFlowVAE`, under `wavegan.` in `token2wav/model.pt`), weight norm folded
into plain weights at load (`fold_weight_norm`). Causal convolutions pad on the left
only; each transposed-convolution upsampler has kernel `2 x rate` and drops its last
`rate` samples, so `n` latent frames give exactly `n x hop` samples. Activations are
snake-beta (log-scale alpha and beta) between a 2x kaiser-sinc upsampler and a 2x
low-pass downsampler (alias-free-torch, as BigVGAN has them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.covo_audio.config import VocoderConfig


def kaiser_sinc_filter(cutoff: float, half_width: float, kernel_size: int) -> torch.Tensor:
    """The `[1, 1, kernel_size]` low-pass filter of alias-free-torch (even kernels)."""
    half = kernel_size // 2
    a = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    if a > 50:
        beta = 0.1102 * (a - 8.7)
    elif a >= 21:
        beta = 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5
    kernel = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    return (kernel / kernel.sum()).view(1, 1, kernel_size)


class UpSample(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.ratio, self.pad = ratio, kernel_size // ratio - 1
        self.pad_left = self.pad * ratio + (kernel_size - ratio) // 2
        self.pad_right = self.pad * ratio + (kernel_size - ratio + 1) // 2
        self.register_buffer("filter", kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        weight = self.filter.to(x.dtype).expand(channels, -1, -1)
        x = self.ratio * F.conv_transpose1d(x, weight, stride=self.ratio, groups=channels)
        return x[..., self.pad_left : -self.pad_right]


class LowPass(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.ratio, self.pad = ratio, (kernel_size // 2 - 1, kernel_size // 2)
        self.register_buffer("filter", kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, kernel_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels = x.shape[1]
        x = F.pad(x, self.pad, mode="replicate")
        weight = self.filter.to(x.dtype).expand(channels, -1, -1)
        return F.conv1d(x, weight, stride=self.ratio, groups=channels)


class DownSample(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lowpass = LowPass()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lowpass(x)


class SnakeBeta(nn.Module):
    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.logscale = logscale
        init = torch.zeros if logscale else torch.ones
        self.alpha = nn.Parameter(init(channels))
        self.beta = nn.Parameter(init(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, beta = self.alpha[None, :, None], self.beta[None, :, None]
        if self.logscale:
            alpha, beta = alpha.exp(), beta.exp()
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha) ** 2


class Activation1d(nn.Module):
    def __init__(self, channels: int, logscale: bool) -> None:
        super().__init__()
        self.act = SnakeBeta(channels, logscale)
        self.upsample = UpSample()
        self.downsample = DownSample()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.downsample(self.act(self.upsample(x)))


class CausalConv1d(nn.Conv1d):
    def __init__(self, channels_in: int, channels_out: int, kernel: int, dilation: int = 1):
        super().__init__(channels_in, channels_out, kernel, dilation=dilation)
        self.left = dilation * (kernel - 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.left, 0)))


class CausalUp(nn.ConvTranspose1d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(x)[..., : -self.stride[0]]


class AMPBlock(nn.Module):
    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...], logscale: bool):
        super().__init__()
        self.convs1 = nn.ModuleList(CausalConv1d(channels, channels, kernel, d) for d in dilations)
        self.convs2 = nn.ModuleList(CausalConv1d(channels, channels, kernel) for _ in dilations)
        self.activations = nn.ModuleList(
            Activation1d(channels, logscale) for _ in range(2 * len(dilations))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acts = self.activations
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, acts[::2], acts[1::2], strict=True):
            x = c2(a2(c1(a1(x)))) + x
        return x


class BigVGAN(nn.Module):
    def __init__(self, config: VocoderConfig) -> None:
        super().__init__()
        channels = config.upsample_initial_channel
        self.conv_pre = nn.Conv1d(config.latent_dim, channels, 7, padding=3)
        self.ups = nn.ModuleList()
        self.resblocks = nn.ModuleList()
        for i, (rate, kernel) in enumerate(
            zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
        ):
            ch_in, ch = channels // 2**i, channels // 2 ** (i + 1)
            self.ups.append(nn.ModuleList([CausalUp(ch_in, ch, kernel, rate)]))
            for k, d in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            ):
                self.resblocks.append(AMPBlock(ch, k, d, config.snake_logscale))
        self.num_kernels = len(config.resblock_kernel_sizes)
        self.activation_post = Activation1d(ch, config.snake_logscale)
        self.conv_post = CausalConv1d(ch, 1, 7)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """`[1, latent_dim, frames]` -> `[1, 1, frames x hop]` samples in [-1, 1]."""
        x = self.conv_pre(latents)
        for i, (up,) in enumerate(self.ups):
            x = up(x)
            blocks = self.resblocks[i * self.num_kernels : (i + 1) * self.num_kernels]
            x = sum(block(x) for block in blocks) / self.num_kernels
        return torch.tanh(self.conv_post(self.activation_post(x)))


def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weight_g` / `weight_v` pairs (torch's old `weight_norm`, as `model.pt` holds them) as
    plain `weight`s: `g * v / ||v||`, the norm over every dim but the first."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".weight_g"):
            continue
        if name.endswith(".weight_v"):
            stem = name[: -len("weight_v")]
            g = state[f"{stem}weight_g"]
            dims = tuple(range(1, tensor.ndim))
            out[f"{stem}weight"] = g * tensor / tensor.norm(dim=dims, keepdim=True)
        else:
            out[name] = tensor
    return out
