"""The convolution blocks of CosyVoice3's causal HiFT vocoder, in plain torch.

Ports of the reference's `CausalConv1d`, `CausalConv1dUpsample`, `CausalConv1dDownSample`
(`cosyvoice/transformer/convolution.py`), `Snake` (`transformer/activation.py`) and the
causal `ResBlock` (`hifigan/generator.py`). Parameter names equal the reference's, so its
tensors load as they are; the weight norm the reference wraps around most of these convs
is folded into plain weights when a checkpoint is loaded (`hift.py`), so none is held here.

Construction draws from the global RNG exactly as the reference's does (same modules,
same shapes, same order), because the vocoder's fixed noise is drawn in between; see
`consume_init_weights` for the one draw that changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def causal_padding(kernel_size: int, dilation: int = 1) -> int:
    """The reference `CausalConv1d`'s padding: `(k - 1) * d` whenever that keeps the length
    (odd kernels, or even kernels with odd dilation; `HiFTConfig` rejects the others)."""
    return int((kernel_size * dilation - dilation) / 2) * 2 + (kernel_size + 1) % 2


def consume_init_weights(convs: Iterable[nn.Conv1d]) -> None:
    """Draw what the reference's `init_weights` (`weight.data.normal_(0, 0.01)`) draws.

    The reference applies it to weight-normed convs, whose `weight` is recomputed from the
    parametrization on every access: the normal draw lands in a temporary and changes no
    weight, but it still advances the global RNG, which later draws depend on.
    """
    for conv in convs:
        torch.empty(conv.weight.shape, dtype=conv.weight.dtype).normal_(0.0, 0.01)


class CausalConv1d(nn.Conv1d):
    """A stride-1 Conv1d that keeps the length by zero-padding one side.

    `look_right=False` pads the left (output `t` sees inputs `<= t`); `look_right=True`
    pads the right (output `t` sees inputs `t .. t + causal_padding`). `forward(x,
    pad=False)` pads nothing: the caller's last `causal_padding` frames are the context
    the padding would stand for (the reference passes them as `cache`), and the output
    is that much shorter than `x`.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dilation: int = 1,
        look_right: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation=dilation)
        self.causal_padding = causal_padding(kernel_size, dilation)
        self.look_right = look_right

    def forward(self, x: torch.Tensor, pad: bool = True) -> torch.Tensor:
        if pad and self.causal_padding:
            side = (0, self.causal_padding) if self.look_right else (self.causal_padding, 0)
            x = F.pad(x, side)
        return super().forward(x)


class CausalUpsampleConv1d(nn.Conv1d):
    """Nearest-neighbour upsampling by `stride`, then a left-padded conv: `T -> stride * T`."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.stride_up = stride
        self.causal_padding = kernel_size - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride_up), mode="nearest")
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class CausalDownsampleConv1d(nn.Conv1d):
    """A strided conv (kernel `2 * stride`) left-padded by `stride - 1`: `T -> (T - 1) // stride`
    (the source STFT's `120 n + 1` frames become the `8 n`, `40 n` frames of the stages)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__(in_channels, out_channels, 2 * stride, stride=stride)
        self.causal_padding = stride - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, per channel (alpha stored as is, not as a log)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        # The same expression as the reference's (1e-9 keeps alpha = 0 finite).
        return x + (1.0 / (alpha + 0.000000001)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """Causal HiFi-GAN residual block: per dilation d, x += conv_k(snake(conv_{k,d}(snake(x))))."""

    def __init__(self, channels: int, kernel_size: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList()
        self.convs2 = nn.ModuleList()
        # Interleaved as the reference appends them: the RNG order of the inits matters.
        for dilation in dilations:
            self.convs1.append(CausalConv1d(channels, channels, kernel_size, dilation=dilation))
            self.convs2.append(CausalConv1d(channels, channels, kernel_size))
        consume_init_weights(self.convs1)
        consume_init_weights(self.convs2)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv1, conv2, act1, act2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = conv2(act2(conv1(act1(x)))) + x
        return x
