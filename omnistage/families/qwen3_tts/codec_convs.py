"""The Qwen3-TTS 12 Hz speech tokenizer decoder's causal convolutions and its SnakeBeta
activation (`codec_decoder` builds the network from them; names are the reference's).

Every convolution is causal and the transposed ones are cut to `stride * length`, so
`n` frames in make exactly `n * stride` samples out and an output sample depends on the
inputs at or before it only. Given a `DecoderStream` (`codec_stream`), a convolution
continues the inputs it kept from the stream's last chunk instead of its zero padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.qwen3_tts.codec_stream import DecoderStream, last


class CausalConvNet(nn.Module):
    """Conv1d with all padding on the left (plus what a stride needs on the right)."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel_size: int, dilation: int = 1, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_ch, out_ch, kernel_size, dilation=dilation, groups=groups)
        self.stride = 1
        self.kernel_size = (kernel_size - 1) * dilation + 1
        self.padding = self.kernel_size - self.stride

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        length = x.shape[-1]
        n_frames = math.ceil((length - self.kernel_size + self.padding) / self.stride + 1)
        extra = (n_frames - 1) * self.stride + self.kernel_size - self.padding - length
        if stream is None or not self.padding:
            return self.conv(F.pad(x, (self.padding, extra)))
        kept = stream.tail(self)  # the stream's last `padding` inputs (zeros at its start)
        padded = torch.cat(
            [x.new_zeros(*x.shape[:-1], self.padding) if kept is None else kept, x], -1
        )
        stream.keep(self, last(padded, self.padding))
        return self.conv(F.pad(padded, (0, extra)))


class CausalTransConvNet(nn.Module):
    """ConvTranspose1d cut to `stride * length` samples (the overlap tail dropped)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_ch, out_ch, kernel_size, stride=stride)
        self.right_pad = kernel_size - stride
        self.stride = stride
        self.kept_frames = math.ceil(self.right_pad / stride)
        """Input frames before a chunk whose overlap reaches into its samples."""

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        length = x.shape[-1] * self.stride
        kept = None if stream is None else stream.tail(self)
        full = x if kept is None else torch.cat([kept, x], -1)
        if stream is not None and self.kept_frames:
            stream.keep(self, last(full, self.kept_frames))
        start = 0 if kept is None else kept.shape[-1] * self.stride  # kept frames' own samples
        return self.conv(full)[..., start : start + length]


class SnakeBeta(nn.Module):
    """x + sin^2(x * e^alpha) / e^beta, per channel (alpha, beta stored as logs).

    Without autograd the per-channel factors `e^alpha` and `1 / (e^beta + 1e-9)` are
    kept between calls (the same values, computed the same way) until a parameter
    changes: its tensor or its version (`load_state_dict`, `copy_`)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self._factors: tuple | None = None
        """(alpha, beta, their versions, addresses and dtype; e^alpha, 1 / (e^beta + 1e-9))."""

    def _scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        alpha, beta = self.alpha, self.beta
        if torch.is_grad_enabled():  # autograd must see the parameters: no cache
            return alpha.exp()[None, :, None], 1.0 / (beta.exp()[None, :, None] + 1e-9)
        state = (alpha._version, beta._version, alpha.data_ptr(), beta.data_ptr(), alpha.dtype)
        kept = self._factors
        if kept is None or kept[0] is not alpha or kept[1] is not beta or kept[2] != state:
            factors = (alpha.exp()[None, :, None], 1.0 / (beta.exp()[None, :, None] + 1e-9))
            kept = self._factors = (alpha, beta, state, *factors)
        return kept[3], kept[4]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha, inverse_beta = self._scales()
        return x + inverse_beta * torch.sin(x * alpha).pow(2)
