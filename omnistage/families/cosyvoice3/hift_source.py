"""CosyVoice3 HiFT's excitation: the causal F0 predictor and the harmonic-plus-noise source.

Ports of the reference's `CausalConvRNNF0Predictor` (`hifigan/f0_predictor.py`) and of
`SourceModuleHnNSF` with `SineGen2(causal=True)` (`hifigan/generator.py`), inference path
only (eval mode). This module owns the source's FIXED noise: the causal reference draws it
once, at construction, from the global RNG instead of per call, so that streamed calls on
growing prefixes see the same noise at the same sample:

    rand_ini    = torch.rand(1, 9); rand_ini[:, 0] = 0     initial phase per harmonic
    sine_waves  = torch.rand(1, 300 * 24000, 9)            additive noise per harmonic
    (l_linear's init)
    uv          = torch.rand(1, 300 * 24000, 1)            noise branch (the vocoder drops it)

We consume the global CPU RNG in exactly that sequence (in pieces: piecewise CPU
`uniform_` yields the same numbers as one call) but keep only the first `max_samples` rows
of `sine_waves`, and nothing of `uv`. Sample `s` of a call always reads noise row `s`; a
call needing more rows than are kept has them drawn again from the RNG state the
construction drew them from (a generator of its own: the same numbers, a longer prefix of
the reference's draw), up to the reference's 300 s; past that it is refused (ValueError),
never wrapped.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.cosyvoice3.hift_layers import CausalConv1d

REFERENCE_NOISE_SAMPLES = 300 * 24000
"""Rows of fixed noise the reference draws (300 s at 24 kHz, whatever the sampling rate)."""

REFERENCE_HARMONICS = 9
"""Width of the reference's fixed noise: the fundamental and 8 overtones, hard-coded."""

F0_LOOK_RIGHT = 3
"""Mel frames the F0 predictor's first conv (kernel 4, padded right) looks ahead."""

_PIECE_ROWS = 1 << 18  # rows per piece of a noise draw (9.4 MB at width 9)


def draw_uniform_prefix(width: int, keep: int) -> torch.Tensor:
    """`torch.rand(1, REFERENCE_NOISE_SAMPLES, width)[:, :keep]` from the global CPU RNG,
    leaving that RNG where the full draw would, without ever holding the full tensor."""
    kept = torch.empty(1, keep, width, device="cpu")
    for start in range(0, keep, _PIECE_ROWS):
        kept[:, start : start + _PIECE_ROWS].uniform_()
    rest = REFERENCE_NOISE_SAMPLES - keep
    scratch = torch.empty(1, min(rest, _PIECE_ROWS), width, device="cpu")
    for start in range(0, rest, _PIECE_ROWS):
        scratch[:, : min(rest - start, _PIECE_ROWS)].uniform_()
    return kept


class CausalF0Predictor(nn.Module):
    """Mel `[B, in_channels, T]` -> F0 in Hz `[B, T']`: five causal convs (ELU), a linear, |.|.

    The first conv looks `F0_LOOK_RIGHT` frames ahead: with `finalize=True` they are zero
    padding and `T' = T`; with `finalize=False` the caller's last `F0_LOOK_RIGHT` frames are
    that context and `T' = T - F0_LOOK_RIGHT`. The vocoder runs this module in float64, as
    the reference does (its note: "f0_predictor precision is crucial for causal inference").
    """

    def __init__(self, in_channels: int, cond_channels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            CausalConv1d(in_channels, cond_channels, F0_LOOK_RIGHT + 1, look_right=True),
            nn.ELU(),
        ]
        for _ in range(4):
            layers += [CausalConv1d(cond_channels, cond_channels, 3), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, 1)

    def forward(self, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        x = self.condnet[0](mel, pad=finalize)
        for index in range(1, len(self.condnet)):
            x = self.condnet[index](x)
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class CausalHarmonicSource(nn.Module):
    """Sample-rate F0 `[1, L, 1]` -> the merged harmonic excitation `[1, L, 1]` (the reference
    `SourceModuleHnNSF(...)[0]` in eval mode with `SineGen2(causal=True)`).

    Per harmonic k = 1..9: a sine whose phase advances once per frame of `upsample_scale`
    samples (the reference's linear downsample then nearest upsample of the phase), zeroed
    where F0 <= `voiced_threshold`, plus fixed noise scaled by `noise_std` (voiced) or
    `sine_amp / 3` (unvoiced); a linear layer and tanh merge the nine.
    """

    def __init__(
        self,
        sampling_rate: int,
        upsample_scale: int,
        sine_amp: float,
        noise_std: float,
        voiced_threshold: float,
        max_samples: int,
    ) -> None:
        super().__init__()
        self.sampling_rate = sampling_rate
        self.upsample_scale = upsample_scale
        self.sine_amp = sine_amp
        self.noise_std = noise_std
        self.voiced_threshold = voiced_threshold
        # The reference's draw order (see the module docstring); do not reorder.
        rand_ini = torch.rand(1, REFERENCE_HARMONICS, device="cpu")
        rand_ini[:, 0] = 0
        self.register_buffer("rand_ini", rand_ini, persistent=False)
        self._noise_rng_state = torch.get_rng_state()
        """Where the sine noise's draw starts (`reserve_samples` draws a longer prefix)."""
        noise = draw_uniform_prefix(REFERENCE_HARMONICS, max_samples)
        self.register_buffer("sine_noise", noise, persistent=False)
        self.l_linear = nn.Linear(REFERENCE_HARMONICS, 1)
        draw_uniform_prefix(1, 0)  # the noise branch's `uv`: drawn, not kept

    @property
    def max_samples(self) -> int:
        """Samples of excitation this source can make (rows of fixed noise kept)."""
        return self.sine_noise.shape[1]

    def reserve_samples(self, samples: int) -> None:
        """Keep at least `samples` rows of fixed noise: more are drawn again from where the
        construction's draw started (the same numbers, leaving the global RNG alone), at least
        doubling what is kept; ValueError past the reference's 300 s."""
        if samples <= self.max_samples:
            return
        if samples > REFERENCE_NOISE_SAMPLES:
            raise ValueError(
                f"{samples} samples ({samples / self.sampling_rate:.2f} s) of excitation "
                f"requested; the vocoder's fixed noise, as the reference's, covers "
                f"{REFERENCE_NOISE_SAMPLES} samples ({REFERENCE_NOISE_SAMPLES / 24000:.0f} s "
                "at 24 kHz)"
            )
        rows = min(REFERENCE_NOISE_SAMPLES, max(samples, 2 * self.max_samples))
        generator = torch.Generator(device="cpu")
        generator.set_state(self._noise_rng_state)
        noise = torch.empty(1, rows, REFERENCE_HARMONICS, device="cpu")
        for start in range(0, rows, _PIECE_ROWS):
            noise[:, start : start + _PIECE_ROWS].uniform_(generator=generator)
        self.sine_noise = noise.to(self.rand_ini.device)

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        samples = f0.shape[1]
        self.reserve_samples(samples)
        harmonics = torch.arange(1, REFERENCE_HARMONICS + 1, dtype=f0.dtype, device=f0.device)
        sines = self._sines(f0 * harmonics) * self.sine_amp
        uv = (f0 > self.voiced_threshold).to(torch.float32)
        # Written as the reference writes it (`(1 - uv) * amp / 3` rounds as `((1 - uv) * amp) / 3`).
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        noise = noise_amp * self.sine_noise[:, :samples]
        return torch.tanh(self.l_linear(sines * uv + noise))

    def _sines(self, f0_harmonics: torch.Tensor) -> torch.Tensor:
        """`[1, L, 9]` harmonic frequencies -> `[1, L, 9]` unit sines (SineGen2._f02sine)."""
        rad = (f0_harmonics / self.sampling_rate) % 1
        # The initial phase lands on sample 0 only; the linear downsample below reads
        # samples 480 i + 239 and + 240, so it never reaches the output (kept for fidelity).
        rad[:, 0, :] = rad[:, 0, :] + self.rand_ini
        scale = self.upsample_scale
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / scale, mode="linear")
        phase = torch.cumsum(rad.transpose(1, 2), dim=1) * 2 * math.pi
        phase = F.interpolate(
            phase.transpose(1, 2) * scale, scale_factor=float(scale), mode="nearest"
        )
        return torch.sin(phase.transpose(1, 2))
