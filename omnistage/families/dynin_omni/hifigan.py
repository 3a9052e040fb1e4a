"""The HiFi-GAN waveform generator of EMOVA's unit-to-speech decoder (UVITS `Generator`,
`dec.*`): style-conditioned input convolution, transposed-convolution upsampling, the
average of multi-receptive-field residual blocks (`resblock` "1" or "2"), tanh output.
Weight-normed layers (`ups`, `resblocks.*.convs*`) hold their fused weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LRELU_SLOPE = 0.1


def _pad(kernel_size: int, dilation: int) -> int:
    return (kernel_size * dilation - dilation) // 2


class ResBlock1(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: list[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_pad(kernel_size, d))
            for d in dilation
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=_pad(kernel_size, 1))
            for _ in dilation
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2 in zip(self.convs1, self.convs2, strict=True):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, LRELU_SLOPE)), LRELU_SLOPE))
        return x


class ResBlock2(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: list[int]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=_pad(kernel_size, d))
            for d in dilation
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = x + conv(F.leaky_relu(x, LRELU_SLOPE))
        return x


class Generator(nn.Module):
    def __init__(
        self,
        in_channels: int,
        resblock: str,
        resblock_kernel_sizes: list[int],
        resblock_dilation_sizes: list[list[int]],
        upsample_rates: list[int],
        upsample_initial_channel: int,
        upsample_kernel_sizes: list[int],
        gin_channels: int,
    ) -> None:
        super().__init__()
        if resblock not in ("1", "2"):
            raise ValueError(f"resblock: must be '1' or '2', got {resblock!r}")
        block = ResBlock1 if resblock == "1" else ResBlock2
        self.n_kernels = len(resblock_kernel_sizes)
        self.conv_pre = nn.Conv1d(in_channels, upsample_initial_channel, 7, padding=3)
        self.ups, self.resblocks = nn.ModuleList(), nn.ModuleList()
        ch = upsample_initial_channel
        for i, (u, k) in enumerate(zip(upsample_rates, upsample_kernel_sizes, strict=True)):
            ch_in, ch = upsample_initial_channel // 2**i, upsample_initial_channel // 2 ** (i + 1)
            self.ups.append(nn.ConvTranspose1d(ch_in, ch, k, u, padding=(k - u) // 2))
            for k_res, d in zip(resblock_kernel_sizes, resblock_dilation_sizes, strict=True):
                self.resblocks.append(block(ch, k_res, d))
        self.conv_post = nn.Conv1d(ch, 1, 7, padding=3, bias=False)
        self.cond = nn.Conv1d(gin_channels, upsample_initial_channel, 1)

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x = self.conv_pre(x) + self.cond(g)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LRELU_SLOPE))
            blocks = self.resblocks[i * self.n_kernels : (i + 1) * self.n_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs = xs + block(x)
            x = xs / self.n_kernels
        return torch.tanh(self.conv_post(F.leaky_relu(x)))
