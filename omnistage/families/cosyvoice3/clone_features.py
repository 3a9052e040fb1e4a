"""The three front ends CosyVoice3 reads a reference clip through, in our own torch code.

The reference (FunAudioLLM/CosyVoice, `cosyvoice/cli/frontend.py`) computes them with
three libraries; each function here is the same computation, float32 throughout:

- `whisper_log_mel`: the speech tokenizer's input, openai-whisper's
  `log_mel_spectrogram(audio, n_mels=128)` on 16 kHz audio (a centred, reflect-padded
  400-point Hann STFT every 160 samples, power spectrum without the last frame, slaney
  mel filters, log10 clamped at 1e-10, floored 8 below the maximum, then `(x + 4) / 4`);
- `prompt_mel`: the flow's prompt features, Matcha-TTS's `mel_spectrogram` with
  `cosyvoice3.yaml`'s `feat_extractor` settings (24 kHz, n_fft = window = 1920, hop 480,
  80 bins, fmin 0, fmax the Nyquist frequency, not centred), `[frames, 80]`;
- `kaldi_fbank`: CAM++'s input, torchaudio's `compliance.kaldi.fbank(num_mel_bins=80,
  dither=0, sample_frequency=16000)` with every other option at its default (25 ms povey
  windows every 10 ms, snipped edges, DC offset removed, pre-emphasis 0.97, a 512-point
  power spectrum, Kaldi's mel banks from 20 Hz to Nyquist, log floored at float32's eps).
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from omnistage.families.qwen3_tts.speaker_encoder import mel_filterbank

WHISPER_RATE = 16000
"""The speech tokenizer's and CAM++'s sample rate."""
FLOW_RATE = 24000
"""The flow's (the checkpoint's `sample_rate`)."""


def whisper_log_mel(audio: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """`[samples]` float32 at 16 kHz -> `[n_mels, samples // 160]` (whisper's)."""
    n_fft, hop = 400, 160
    window = torch.hann_window(n_fft)
    stft = torch.stft(audio, n_fft, hop, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    filters = torch.from_numpy(mel_filterbank(WHISPER_RATE, n_fft, n_mels, 0.0, 8000.0))
    log_spec = torch.clamp(filters @ magnitudes, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def prompt_mel(audio: torch.Tensor) -> torch.Tensor:
    """`[samples]` float32 at 24 kHz -> `[frames, 80]` log-mel (Matcha's, the yaml's)."""
    n_fft = win = 1920
    hop = 480
    basis = torch.from_numpy(mel_filterbank(FLOW_RATE, n_fft, 80, 0.0, FLOW_RATE / 2))
    padding = (n_fft - hop) // 2
    padded = F.pad(audio.view(1, 1, -1), (padding, padding), mode="reflect").view(1, -1)
    spec = torch.stft(
        padded, n_fft, hop_length=hop, win_length=win, window=torch.hann_window(win),
        center=False, normalized=False, onesided=True, return_complex=True,
    )  # fmt: skip
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ spec, min=1e-5))[0].T


def _kaldi_mel(value: torch.Tensor | float) -> torch.Tensor | float:
    if isinstance(value, torch.Tensor):
        return 1127.0 * (1.0 + value / 700.0).log()
    return 1127.0 * math.log(1.0 + value / 700.0)


def kaldi_mel_banks(num_bins: int, padded_window: int, sample_rate: float) -> torch.Tensor:
    """`[num_bins, padded_window // 2 + 1]` Kaldi's triangular mel banks (20 Hz to
    Nyquist, no VTLN warp), the last FFT bin's column zero, as torchaudio builds them."""
    num_fft_bins = padded_window // 2
    nyquist = 0.5 * sample_rate
    mel_low, mel_high = _kaldi_mel(20.0), _kaldi_mel(nyquist)
    delta = (mel_high - mel_low) / (num_bins + 1)
    index = torch.arange(num_bins).unsqueeze(1)
    left = mel_low + index * delta
    center = mel_low + (index + 1.0) * delta
    right = mel_low + (index + 2.0) * delta
    mel = _kaldi_mel(sample_rate / padded_window * torch.arange(num_fft_bins)).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return F.pad(banks, (0, 1))


def kaldi_fbank(audio: torch.Tensor, num_mel_bins: int = 80) -> torch.Tensor:
    """`[samples]` float32 at 16 kHz -> `[frames, num_mel_bins]` log filterbank energies
    (torchaudio's `kaldi.fbank` with the reference's options; module docstring)."""
    size, shift, padded = 400, 160, 512  # 25 ms, 10 ms, the next power of two
    if audio.numel() < size:
        raise ValueError("audio: the clip is shorter than one 25 ms frame")
    frames = audio.unfold(0, size, shift)
    frames = frames - frames.mean(dim=1, keepdim=True)
    previous = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)[:, :-1]
    frames = frames - 0.97 * previous
    frames = frames * torch.hann_window(size, periodic=False).pow(0.85).unsqueeze(0)
    frames = F.pad(frames, (0, padded - size))
    spectrum = torch.fft.rfft(frames).abs().pow(2.0)
    energies = spectrum @ kaldi_mel_banks(num_mel_bins, padded, WHISPER_RATE).T
    return torch.max(energies, torch.tensor(torch.finfo(torch.float32).eps)).log()
