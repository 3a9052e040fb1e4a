"""Ming-Omni's audio features: Kaldi fbank, low frame rate (LFR) stacking and CMVN, as the
reference's `audio_processing_bailingmm.WavFrontend.forward` computes them.

The reference calls torchaudio's `compliance.kaldi.fbank` (not a dependency here); this
is the same computation for the options `WavFrontend` passes (dither 0, energy floor 0,
`snip_edges`, the window it names) and Kaldi's defaults for the rest (pre-emphasis 0.97,
DC offset removed per frame, FFT size rounded up to a power of two, power spectrum, mel
banks from 20 Hz to Nyquist, log with a float epsilon floor, no energy column), written
op for op in the same order and dtype (float32 banks) so that the features equal the
reference's bit for bit (tests/models/test_ming_omni_audio.py checks them against the
fixture). Then:

- the waveform (16 kHz float in [-1, 1]) is scaled by 2**15 first (`upsacle_samples`);
- `apply_lfr`: `lfr_m` frames stacked every `lfr_n` frames, `(lfr_m - 1) // 2` copies of
  the first frame in front, the last frame repeated to fill the tail;
- `apply_cmvn`: `(x + shift) * scale` from the checkpoint's `am.mvn` (Kaldi nnet text:
  the `<AddShift>` and `<Rescale>` rows after `<LearnRateCoef>`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

EPSILON = torch.finfo(torch.float32).eps
WINDOWS = ("hamming", "hanning", "povey", "rectangular")


def _window(kind: str, size: int) -> torch.Tensor:
    if kind == "hamming":
        return torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46)
    if kind == "hanning":
        return torch.hann_window(size, periodic=False)
    if kind == "povey":
        return torch.hann_window(size, periodic=False).pow(0.85)
    return torch.ones(size)


def _mel(freq: torch.Tensor | float) -> Any:
    if isinstance(freq, torch.Tensor):
        return 1127.0 * (1.0 + freq / 700.0).log()
    return 1127.0 * math.log(1.0 + freq / 700.0)


def mel_banks(num_bins: int, padded: int, rate: float, low: float = 20.0) -> torch.Tensor:
    """Kaldi's triangular mel banks, [num_bins, padded // 2] (float32, as torchaudio)."""
    nyquist = 0.5 * rate
    mel_low, mel_high = _mel(low), _mel(nyquist)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins).unsqueeze(1)
    left = mel_low + b * delta
    center = mel_low + (b + 1.0) * delta
    right = mel_low + (b + 2.0) * delta
    mel = _mel(rate / padded * torch.arange(padded / 2)).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    return torch.max(torch.zeros(1), torch.min(up, down))


def fbank(
    waveform: torch.Tensor,
    num_mel_bins: int,
    frame_length: float = 25.0,
    frame_shift: float = 10.0,
    window: str = "hamming",
    rate: float = 16000.0,
) -> torch.Tensor:
    """[frames, num_mel_bins] log mel energies of a 1-D float32 waveform (snip_edges)."""
    shift = int(rate * frame_shift * 0.001)
    size = int(rate * frame_length * 0.001)
    padded = 1 if size == 0 else 2 ** (size - 1).bit_length()
    if waveform.numel() < size:
        raise ValueError(f"audio: {waveform.numel()} samples, under one {frame_length} ms frame")
    m = 1 + (waveform.numel() - size) // shift
    frames = waveform.contiguous().as_strided((m, size), (shift, 1))
    frames = frames - frames.mean(dim=1).unsqueeze(1)
    previous = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    frames = frames - 0.97 * previous[:, :-1]
    frames = frames * _window(window, size).unsqueeze(0)
    frames = F.pad(frames.unsqueeze(0), (0, padded - size), mode="constant", value=0).squeeze(0)
    spectrum = torch.fft.rfft(frames).abs().pow(2.0)
    banks = F.pad(mel_banks(num_mel_bins, padded, rate), (0, 1), mode="constant", value=0)
    energies = torch.mm(spectrum, banks.T)
    return torch.max(energies, torch.tensor(EPSILON)).log()


def apply_lfr(feats: torch.Tensor, lfr_m: int, lfr_n: int) -> torch.Tensor:
    """Stack `lfr_m` frames every `lfr_n` (the reference's `apply_lfr`)."""
    t = feats.shape[0]
    out_frames = math.ceil(t / lfr_n)
    left = (lfr_m - 1) // 2
    feats = torch.vstack((feats[0].repeat(left, 1), feats))
    t += left
    rows = []
    for i in range(out_frames):
        if lfr_m <= t - i * lfr_n:
            rows.append(feats[i * lfr_n : i * lfr_n + lfr_m].reshape(1, -1))
        else:
            tail = feats[i * lfr_n :].reshape(-1)
            pad = feats[-1].repeat(lfr_m - (t - i * lfr_n))
            rows.append(torch.cat((tail, pad)).reshape(1, -1))
    return torch.vstack(rows)


def load_cmvn(path: Path) -> torch.Tensor:
    """[2, dim] (shift, scale) from a Kaldi nnet `am.mvn` (ValueError naming the file)."""
    lines = [line.split() for line in path.read_text().splitlines()]
    found: dict[str, list[str]] = {}
    for i, items in enumerate(lines[:-1]):
        following = lines[i + 1]
        if (
            items
            and items[0] in ("<AddShift>", "<Rescale>")
            and following[:1] == ["<LearnRateCoef>"]
        ):
            found[items[0]] = following[3:-1]
    if set(found) != {"<AddShift>", "<Rescale>"} or len(found["<AddShift>"]) != len(
        found["<Rescale>"]
    ):
        raise ValueError(f"{path}: no <AddShift> / <Rescale> rows of one width")
    return torch.tensor([[float(v) for v in found[k]] for k in ("<AddShift>", "<Rescale>")])


@dataclass(frozen=True)
class WavFrontend:
    """The reference's `WavFrontend` settings (`wav_frontend_args` of
    `preprocessor_config.json`) with its CMVN rows."""

    cmvn: torch.Tensor | None
    """[2, dim] shift and scale, or None (no `cmvn_file`)."""
    n_mels: int = 80
    """Mel bins per frame."""
    frame_length: float = 25.0
    """Frame length in ms."""
    frame_shift: float = 10.0
    """Frame shift in ms."""
    window: str = "hamming"
    """Kaldi window type."""
    lfr_m: int = 1
    """Frames stacked per LFR frame."""
    lfr_n: int = 1
    """LFR stride in frames."""
    fs: int = 16000
    """Sampling rate of the waveform."""

    def __post_init__(self) -> None:
        if self.window not in WINDOWS:
            raise ValueError(f"wav_frontend_args.window: {self.window!r} (one of {WINDOWS})")
        if self.n_mels <= 3:
            raise ValueError(f"wav_frontend_args.n_mels: {self.n_mels} (more than 3)")
        for name in ("lfr_m", "lfr_n"):
            if getattr(self, name) < 1:
                raise ValueError(f"wav_frontend_args.{name}: must be at least 1")

    @classmethod
    def from_args(cls, args: dict[str, Any], folder: Path) -> WavFrontend:
        """From `wav_frontend_args` (a relative `cmvn_file` is read from `folder`)."""
        if not args.get("snip_edges", True) or not args.get("upsacle_samples", True):
            raise ValueError("wav_frontend_args: only snip_edges and upsacle_samples true")
        fields = ("n_mels", "frame_length", "frame_shift", "window", "lfr_m", "lfr_n", "fs")
        cmvn_file = args.get("cmvn_file")
        cmvn = None if cmvn_file is None else load_cmvn(folder / cmvn_file)
        return cls(cmvn, **{k: args[k] for k in fields if k in args})

    @property
    def dim(self) -> int:
        """Width of a feature row."""
        return self.n_mels * self.lfr_m

    def __call__(self, waveform: torch.Tensor) -> torch.Tensor:
        """[frames, dim] float32 features of a 1-D waveform at `fs` Hz in [-1, 1]."""
        wave = waveform.to(torch.float32) * (1 << 15)
        mat = fbank(wave, self.n_mels, self.frame_length, self.frame_shift, self.window, self.fs)
        if self.lfr_m != 1 or self.lfr_n != 1:
            mat = apply_lfr(mat, self.lfr_m, self.lfr_n)
        if self.cmvn is not None:
            mat = (mat + self.cmvn[0:1, : self.dim]) * self.cmvn[1:2, : self.dim]
        return mat.to(torch.float32)
