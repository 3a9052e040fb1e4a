"""Ming-Omni's HiFT vocoder (CosyVoice-1's non-causal `HiFTGenerator` with its
`ConvRNNF0Predictor`): 80-bin mel -> 22.05 kHz waveform, inference only.

Ported from the reference `audio_detokenizer/hifigan/` under its parameter names
(`conv_pre`, `ups.N`, `source_downs.N`, `source_resblocks.N`, `resblocks.N`,
`conv_post`, `m_source.l_linear`, `f0_predictor.condnet.K`, `f0_predictor.classifier`);
weight-norm pairs in `hift.pt` are folded at load by `cosyvoice3.hift._fold_checkpoint`.

What differs from our CosyVoice3 HiFT (`cosyvoice3/hift.py`, the causal generator):
symmetric ("same") convolutions and transposed-conv upsampling here, no look-ahead or
streaming holdback, an F0 predictor in the model dtype, and a sine source whose random
initial phases and additive noise are drawn per call (from the request's generator,
in the reference's order: phases `rand`, then noise `randn`) instead of a fixed table.
The harmonic `Snake` / `ResBlock` conv stack is the same shape but "same"-padded.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.cosyvoice3.hift import _fold_checkpoint
from omnistage.families.cosyvoice3.hift_layers import Snake
from omnistage.families.ming_omni.vocoder_config import MingHiFTConfig


def _same(kernel: int, dilation: int = 1) -> int:
    return (kernel * dilation - dilation) // 2


class ResBlock(nn.Module):
    """HiFi-GAN residual block, "same" padding: x += conv2(snake(conv1_d(snake(x))))."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, dilation=d, padding=_same(kernel, d))
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel, padding=_same(kernel)) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(
            self.convs1, self.convs2, self.activations1, self.activations2, strict=True
        ):
            x = c2(a2(c1(a1(x)))) + x
        return x


class ConvRNNF0Predictor(nn.Module):
    """Five (Conv1d k3, ELU) then a linear classifier; |F0| per mel frame."""

    def __init__(self, in_channels: int, cond_channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            layers += [
                nn.Conv1d(in_channels if i == 0 else cond_channels, cond_channels, 3, padding=1),
                nn.ELU(),
            ]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.abs(self.classifier(self.condnet(mel).transpose(1, 2)).squeeze(-1))


class SourceModule(nn.Module):
    """`SourceModuleHnNSF` with its `SineGen`: harmonics of F0, merged by `l_linear`, tanh."""

    def __init__(self, c: MingHiFTConfig) -> None:
        super().__init__()
        self.c = c
        self.l_linear = nn.Linear(c.nb_harmonics + 1, 1)

    def forward(self, f0: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """f0 [1, samples] (Hz) -> excitation [1, 1, samples]."""
        c = self.c
        harmonics = torch.arange(1, c.nb_harmonics + 2, dtype=torch.float32).view(1, -1, 1)
        f_mat = f0.float().unsqueeze(1) * harmonics / c.sampling_rate
        theta = 2 * math.pi * (torch.cumsum(f_mat, dim=-1) % 1)
        phase = (
            torch.rand((1, c.nb_harmonics + 1, 1), generator=generator) * (2 * math.pi) - math.pi
        )
        phase[:, 0, :] = 0
        sines = c.nsf_alpha * torch.sin(theta + phase)
        uv = (f0.float().unsqueeze(1) > c.nsf_voiced_threshold).float()
        noise_amp = uv * c.nsf_sigma + (1 - uv) * c.nsf_alpha / 3
        sines = sines * uv + noise_amp * torch.randn(sines.shape, generator=generator)
        dtype = self.l_linear.weight.dtype
        return torch.tanh(self.l_linear(sines.to(dtype).transpose(1, 2))).transpose(1, 2)


class MingHiFT(nn.Module):
    """`HiFTGenerator.inference`: mel [1, 80, T] -> waveform [1, samples_per_frame * T]."""

    def __init__(self, c: MingHiFTConfig) -> None:
        super().__init__()
        self.c = c
        base, n_stft = c.base_channels, c.n_fft + 2
        self.m_source = SourceModule(c)
        self.conv_pre = nn.Conv1d(c.in_channels, base, 7, 1, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(base // 2**i, base // 2 ** (i + 1), k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes, strict=True))
        )
        rates = [1, *list(c.upsample_rates[::-1][:-1])]
        cum = [math.prod(rates[: i + 1]) for i in range(len(rates))][::-1]
        self.source_downs, self.source_resblocks = nn.ModuleList(), nn.ModuleList()
        for i, (u, k, d) in enumerate(
            zip(cum, c.source_resblock_kernel_sizes, c.source_resblock_dilation_sizes, strict=True)
        ):
            ch = base // 2 ** (i + 1)
            down = (
                nn.Conv1d(n_stft, ch, 1, 1)
                if u == 1
                else nn.Conv1d(n_stft, ch, u * 2, u, padding=u // 2)
            )
            self.source_downs.append(down)
            self.source_resblocks.append(ResBlock(ch, k, d))
        self.resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, d)
            for i in range(len(self.ups))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=True)
        )
        self.conv_post = nn.Conv1d(base // 2 ** len(self.ups), n_stft, 7, 1, padding=3)
        self.f0_predictor = ConvRNNF0Predictor(c.in_channels, c.f0_cond_channels)
        self.register_buffer(
            "stft_window", torch.hann_window(c.n_fft, periodic=True), persistent=False
        )
        self._register_load_state_dict_pre_hook(_fold_checkpoint, with_module=True)

    def _stft(self, x: torch.Tensor) -> torch.Tensor:
        c, window = self.c, self.stft_window.to(x.dtype)
        spec = torch.view_as_real(
            torch.stft(x, c.n_fft, c.hop_len, c.n_fft, window=window, return_complex=True)
        )
        return torch.cat([spec[..., 0], spec[..., 1]], dim=1)

    def inference(self, mel: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        c = self.c
        f0 = self.f0_predictor(mel).repeat_interleave(c.samples_per_frame, dim=-1)
        s_stft = self._stft(self.m_source(f0, generator).squeeze(1))
        x = self.conv_pre(mel)
        kernels = len(c.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, c.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            x = sum(self.resblocks[i * kernels + j](x) for j in range(kernels)) / kernels
        x = self.conv_post(F.leaky_relu(x))
        half = c.n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :half]), max=1e2)
        phase = torch.sin(x[:, half:])
        spectrum = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        window = self.stft_window.to(x.dtype)
        audio = torch.istft(spectrum, c.n_fft, c.hop_len, c.n_fft, window=window)
        return torch.clamp(audio, -c.audio_limit, c.audio_limit)
