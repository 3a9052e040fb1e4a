"""The log-mel features of EMOVA's speech-to-unit encoder (S2U), as the vendored NeMo's
`FilterbankFeatures.forward` computes them at inference for the configuration in
EMOVA_speech_tokenizer's `SPIRAL_L2_BN_FSQ_CTC/my_conf` (`AudioToMelSpectrogramPreprocessor`:
16 kHz, 20 ms Hann window, 10 ms hop, 128 mels, `normalize='per_feature'`,
`normalize_time_domain=True`, `dither_train_only=True`, `stft_conv=False`):

1. the waveform divided by (its largest magnitude + 1e-5) (`normalize_time_domain`);
2. pre-emphasis 0.97 (the first sample kept);
3. `torch.stft` (n_fft the next power of two of the window, 512; `center=True`, reflect
   padding; a symmetric Hann window of 320 samples), magnitude, squared;
4. librosa's Slaney mel banks (0 Hz to Nyquist, Slaney norm, float32): here
   transformers' `mel_filter_bank` with the same scale and norm;
5. `log(x + 2**-24)`;
6. per mel bin: minus the mean, divided by (the unbiased std + 1e-5), over the first
   `ceil(n / hop)` frames (the "length"); frames past it set to 0 and the time axis
   padded with zeros to a multiple of 16 (`pad_to`).

No dither at inference (`dither_train_only`). One waveform at a time: in a padded batch
the reference's last frames would see the padding's zeros where alone they see the
reflected signal, so the reference is itself not batch-invariant; omnistage runs each
request's audio alone, as the reference's `sample_extract_unit` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from transformers.audio_utils import mel_filter_bank

LOG_GUARD = 2.0**-24
NORM_EPS = 1e-5


@dataclass(frozen=True)
class S2UFeatureConfig:
    sample_rate: int = 16000
    """Input rate the encoder was trained at (Hz); other rates are refused."""
    window_size: float = 0.02
    """STFT window length in seconds (320 samples at 16 kHz)."""
    window_stride: float = 0.01
    """STFT hop in seconds (160 samples: 100 frames a second)."""
    features: int = 128
    """Number of mel bins."""
    preemph: float = 0.97
    """Pre-emphasis coefficient."""
    pad_to: int = 16
    """The time axis is zero-padded to a multiple of this."""

    def __post_init__(self) -> None:
        for name in ("sample_rate", "features", "pad_to"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.window_size <= 0 or self.window_stride <= 0:
            raise ValueError("window_size / window_stride: must be positive")

    @property
    def win_length(self) -> int:
        return int(self.window_size * self.sample_rate)

    @property
    def hop_length(self) -> int:
        return int(self.window_stride * self.sample_rate)

    @property
    def n_fft(self) -> int:
        return 2 ** math.ceil(math.log2(self.win_length))


class S2UFeatures:
    """Waveform [n] (float, the encoder's rate) -> (features [features, T padded], length)."""

    def __init__(self, config: S2UFeatureConfig) -> None:
        self.config = config
        banks = mel_filter_bank(
            num_frequency_bins=config.n_fft // 2 + 1,
            num_mel_filters=config.features,
            min_frequency=0.0,
            max_frequency=config.sample_rate / 2,
            sampling_rate=config.sample_rate,
            norm="slaney",
            mel_scale="slaney",
        )
        # librosa builds the banks in float64 and stores them as float32, as here.
        self.banks = torch.from_numpy(banks.T.astype(np.float32))
        self.window = torch.hann_window(config.win_length, periodic=False)

    def num_frames(self, num_samples: int) -> int:
        """The features' valid length: ceil(samples / hop)."""
        return -(-num_samples // self.config.hop_length)

    def __call__(self, wav: torch.Tensor) -> tuple[torch.Tensor, int]:
        cfg = self.config
        x = wav.reshape(1, -1)
        length = self.num_frames(x.shape[1])
        x = x * (1.0 / (x.abs().max(dim=1, keepdim=True)[0] + 1e-5))
        x = torch.cat((x[:, :1], x[:, 1:] - cfg.preemph * x[:, :-1]), dim=1)
        spec = torch.stft(
            x,
            n_fft=cfg.n_fft,
            hop_length=cfg.hop_length,
            win_length=cfg.win_length,
            center=True,
            window=self.window.to(dtype=x.dtype),
            return_complex=True,
        )
        spec = torch.view_as_real(spec)
        power = torch.sqrt(spec.pow(2).sum(-1)).pow(2.0)
        mel = torch.log(torch.matmul(self.banks.unsqueeze(0).to(power.dtype), power) + LOG_GUARD)
        valid = mel[:, :, :length]
        mean = valid.mean(dim=2)
        std = valid.std(dim=2) + NORM_EPS
        mel = (mel - mean.unsqueeze(2)) / std.unsqueeze(2)
        mel[:, :, length:] = 0.0
        pad = mel.shape[-1] % cfg.pad_to
        if pad:
            mel = torch.nn.functional.pad(mel, (0, cfg.pad_to - pad))
        return mel[0], length
