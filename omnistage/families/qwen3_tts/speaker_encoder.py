"""Qwen3-TTS's speaker encoder: the 128-bin log-mel front end and the ECAPA-TDNN x-vector.

A voice-clone prompt carries one speaker embedding (`enc_dim` floats) taken from the
reference clip. This module owns how it is computed, following the official `qwen-tts`
0.1.1 (`Qwen3TTSSpeakerEncoder`, `mel_spectrogram`, `extract_speaker_embedding`):

- the mel front end: reflect-pad by `(n_fft - hop) / 2`, a Hann-window STFT (not
  centred), magnitude `sqrt(re^2 + im^2 + 1e-9)`, a slaney-normed mel filterbank
  (the same numbers as `librosa.filters.mel`, computed here without librosa) and
  `log(clamp(x, 1e-5))`;
- the network: a TDNN, SE-Res2Net blocks, multi-layer feature aggregation,
  attentive statistics pooling and a final 1x1 convolution. Its parameter names are
  the reference's, which sit under `speaker_encoder.` in the main checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

PREFIX = "speaker_encoder."
SAMPLE_RATE = 24000
MEL_PARAMS = {
    "n_fft": 1024,
    "num_mels": 128,
    "sampling_rate": 24000,
    "hop_size": 256,
    "win_size": 1024,
    "fmin": 0.0,
    "fmax": 12000.0,
}
_DEFAULTS: dict[str, Any] = {
    "mel_dim": 128,
    "enc_dim": 1024,
    "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 128,
    "enc_res2net_scale": 8,
    "enc_se_channels": 128,
    "sample_rate": 24000,
}


# -- mel front end -----------------------------------------------------------------------


def _hz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa, `htk=False`)."""
    freq = np.asarray(freq, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = freq / f_sp
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = freq >= min_log_hz
    mels = np.where(
        log_t, min_log_mel + np.log(np.maximum(freq, 1e-10) / min_log_hz) / logstep, mels
    )
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz, min_log_mel, logstep = 1000.0, 1000.0 / f_sp, np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    return np.where(log_t, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


def mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float
) -> np.ndarray:
    """`[n_mels, n_fft // 2 + 1]` float32 triangular filters, slaney-normed (= librosa's)."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    mel_f = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, 1 + n_fft // 2), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, np.newaxis]
    return weights


def mel_spectrogram(audio: torch.Tensor) -> torch.Tensor:
    """`[batch, samples]` float32 at 24 kHz -> `[batch, 128, frames]` log-mel (the reference's)."""
    p = MEL_PARAMS
    n_fft, hop, win = int(p["n_fft"]), int(p["hop_size"]), int(p["win_size"])
    basis = mel_filterbank(int(p["sampling_rate"]), n_fft, int(p["num_mels"]), p["fmin"], p["fmax"])
    mel_basis = torch.from_numpy(basis).float().to(audio.device)
    window = torch.hann_window(win).to(audio.device)
    padding = (n_fft - hop) // 2
    audio = F.pad(audio.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)
    spec = torch.stft(
        audio,
        n_fft,
        hop_length=hop,
        win_length=win,
        window=window,
        center=False,
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(mel_basis, spec), min=1e-5))


# -- the ECAPA-TDNN ----------------------------------------------------------------------


def _conv(c_in: int, c_out: int, kernel: int = 1, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(c_in, c_out, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class TimeDelayNetBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _conv(c_in, c_out, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class Res2NetBlock(nn.Module):
    """Split the channels in `scale` groups; group i > 0 goes through a TDNN after adding
    the previous group's output (group 0 passes through)."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(
            TimeDelayNetBlock(width, width, kernel, dilation) for _ in range(scale - 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        out = [parts[0]]
        prev: torch.Tensor | None = None
        for block, part in zip(self.blocks, parts[1:], strict=True):
            prev = block(part if prev is None else part + prev)
            out.append(prev)
        return torch.cat(out, dim=1)


class SqueezeExcitationBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = _conv(channels, se_channels)
        self.conv2 = _conv(se_channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class SqueezeExcitationRes2NetBlock(nn.Module):
    """TDNN -> Res2Net -> TDNN -> SE, plus the residual."""

    def __init__(self, c_in: int, c_out: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TimeDelayNetBlock(c_in, c_out, 1, 1)
        self.res2net_block = Res2NetBlock(c_out, scale, kernel, dilation)
        self.tdnn2 = TimeDelayNetBlock(c_out, c_out, 1, 1)
        self.se_block = SqueezeExcitationBlock(c_out, se)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class AttentiveStatisticsPooling(nn.Module):
    """Attention over time (conditioned on the global mean and std), then the attended mean
    and std per channel: `[B, C, T]` -> `[B, 2C, 1]`."""

    eps = 1e-12

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TimeDelayNetBlock(channels * 3, attention_channels, 1, 1)
        self.conv = _conv(attention_channels, channels)

    def _stats(self, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        var = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(2)
        return mean, torch.sqrt(var.clamp(self.eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        uniform = torch.full((x.shape[0], 1, length), 1.0 / length, dtype=x.dtype, device=x.device)
        mean, std = self._stats(x, uniform)
        context = torch.cat(
            [x, mean.unsqueeze(2).expand(-1, -1, length), std.unsqueeze(2).expand(-1, -1, length)],
            dim=1,
        )
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, attention)
        return torch.cat((mean, std), dim=1).unsqueeze(2)


def _field(config: Any, name: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, _DEFAULTS[name])
    return getattr(config, name, _DEFAULTS[name])


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN: `[B, frames, mel_dim]` log-mel -> `[B, enc_dim]` speaker embedding."""

    def __init__(self, config: Mapping[str, Any] | Any) -> None:
        super().__init__()
        channels = list(_field(config, "enc_channels"))
        kernels = list(_field(config, "enc_kernel_sizes"))
        dilations = list(_field(config, "enc_dilations"))
        if not len(channels) == len(kernels) == len(dilations) or len(channels) < 2:
            raise ValueError(
                "speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations must "
                "have the same length (at least 2)"
            )
        self.mel_dim = int(_field(config, "mel_dim"))
        self.sample_rate = int(_field(config, "sample_rate"))
        scale, se = int(_field(config, "enc_res2net_scale")), int(_field(config, "enc_se_channels"))
        self.blocks = nn.ModuleList(
            [TimeDelayNetBlock(self.mel_dim, channels[0], kernels[0], dilations[0])]
        )
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SqueezeExcitationRes2NetBlock(
                    channels[i - 1], channels[i], scale, se, kernels[i], dilations[i]
                )
            )
        self.mfa = TimeDelayNetBlock(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatisticsPooling(
            channels[-1], int(_field(config, "enc_attention_channels"))
        )
        self.fc = _conv(channels[-1] * 2, int(_field(config, "enc_dim")))

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outs = []
        for layer in self.blocks:
            x = layer(x)
            outs.append(x)
        x = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @torch.inference_mode()
    def embed(self, audio: np.ndarray) -> torch.Tensor:
        """The speaker embedding `[enc_dim]` of a mono float32 clip at 24 kHz."""
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim != 1 or samples.size < int(MEL_PARAMS["n_fft"]):
            raise ValueError(
                f"ref_audio: expected a 1-D clip of at least {MEL_PARAMS['n_fft']} samples at "
                f"{SAMPLE_RATE} Hz, got shape {list(samples.shape)}"
            )
        device = self.fc.weight.device
        mels = mel_spectrogram(torch.from_numpy(samples).unsqueeze(0).to(device)).transpose(1, 2)
        return self(mels.to(self.dtype))[0]

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, config: Mapping[str, Any] | Any, dtype: torch.dtype = torch.float32
    ) -> SpeakerEncoder:
        """Built from `config` (`speaker_encoder_config`), weights = the `speaker_encoder.*`
        tensors of `path/model.safetensors` (or of the shards an index names), strictly."""
        from omnistage.models.loader import iter_weights

        model = cls(config)
        state = {k[len(PREFIX) :]: t for k, t in iter_weights(Path(path), [PREFIX])}
        expected = set(model.state_dict())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise ValueError(
                f"speaker encoder weights in {path} do not match speaker_encoder_config: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model.load_state_dict(state, strict=True)
        return model.to(dtype).eval()
