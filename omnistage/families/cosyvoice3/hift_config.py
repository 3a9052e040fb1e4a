"""The config of CosyVoice3's causal HiFT vocoder: `HiFTConfig`, the `hift:` section of
`cosyvoice3.yaml` (the reference `CausalHiFTGenerator`'s constructor arguments), checked
against what the causal reference can run, and the frame/sample arithmetic of streaming
(`output_samples`) that callers need without building the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from omnistage.families.cosyvoice3.hift_layers import causal_padding
from omnistage.families.cosyvoice3.hift_source import (
    F0_LOOK_RIGHT,
    REFERENCE_HARMONICS,
    REFERENCE_NOISE_SAMPLES,
)

_TRIPLE = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
_INT_TUPLES = (
    "upsample_rates",
    "upsample_kernel_sizes",
    "resblock_kernel_sizes",
    "source_resblock_kernel_sizes",
)
_NESTED = ("resblock_dilation_sizes", "source_resblock_dilation_sizes")


@dataclasses.dataclass(frozen=True)
class HiFTConfig:
    """`CausalHiFTGenerator`'s constructor arguments (`istft_params` flattened to `n_fft`,
    `hop_len`; the F0 predictor's `cond_channels` as `f0_cond_channels`), defaults as the
    released CosyVoice3 (`cosyvoice3.yaml`), plus how much fixed noise to keep."""

    in_channels: int = 80
    """Mel bins (the F0 predictor reads the same mel)."""
    base_channels: int = 512
    """Channels after `conv_pre`; halved by each upsampling stage."""
    nb_harmonics: int = 8
    """Overtones above F0 in the source; the causal reference hard-codes 8."""
    sampling_rate: int = 24000
    """Output rate in Hz (22050 makes the reference switch to its non-causal SineGen)."""
    nsf_alpha: float = 0.1
    """Amplitude of the source sines."""
    nsf_sigma: float = 0.003
    """Scale of the fixed noise in voiced samples."""
    nsf_voiced_threshold: float = 10.0
    """F0 (Hz) above which a sample is voiced."""
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    """Upsampling factor of each stage."""
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    """Kernel of each stage's upsampling conv."""
    n_fft: int = 16
    """iSTFT size (`istft_params.n_fft`); even."""
    hop_len: int = 4
    """iSTFT hop (`istft_params.hop_len`)."""
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    """Kernels of the ResBlocks averaged after each stage."""
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = _TRIPLE
    """Dilations of each of those ResBlocks."""
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    """Kernel of the ResBlock on the source at each stage (one per stage)."""
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = _TRIPLE
    """Dilations of those ResBlocks."""
    lrelu_slope: float = 0.1
    """Leaky-ReLU slope before each upsampling (the one before `conv_post` is 0.01)."""
    audio_limit: float = 0.99
    """Output clamp."""
    conv_pre_look_right: int = 4
    """Mel frames `conv_pre` looks ahead (its kernel is this + 1)."""
    f0_cond_channels: int = 512
    """The F0 predictor's channels (`f0_predictor.cond_channels`)."""
    max_seconds: float = 60.0
    """Seconds of fixed noise drawn at construction (the RNG still advances by the
    reference's 300 s; 8.6 MB of float32 per 10 s); a longer call draws more, the same
    numbers, up to those 300 s. Not a reference argument."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type == "int" and (type(value) is not int or value < 1):
                raise ValueError(f"HiFTConfig.{field.name}: a positive int, got {value!r}")
            if field.type == "float" and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise ValueError(f"HiFTConfig.{field.name}: a number, got {value!r}")
        self._check_lists()
        self._check_causal()
        if self.max_seconds <= 0 or self.max_samples > REFERENCE_NOISE_SAMPLES:
            raise ValueError(
                f"HiFTConfig.max_seconds: {self.max_seconds} s at {self.sampling_rate} Hz is "
                f"outside (0, {REFERENCE_NOISE_SAMPLES} samples] (the reference's noise)"
            )

    def _check_lists(self) -> None:
        stages = len(self.upsample_rates)
        lengths = {
            "upsample_kernel_sizes": stages,
            "source_resblock_kernel_sizes": stages,
            "source_resblock_dilation_sizes": stages,
            "resblock_dilation_sizes": len(self.resblock_kernel_sizes),
        }
        for name in _INT_TUPLES + _NESTED:
            value = getattr(self, name)
            flat = [v for d in value for v in d] if name in _NESTED else list(value)
            if not value or not all(type(v) is int and v >= 1 for v in flat):
                raise ValueError(f"HiFTConfig.{name}: positive ints, got {value!r}")
            if name in lengths and len(value) != lengths[name]:
                raise ValueError(f"HiFTConfig.{name}: needs {lengths[name]} entries, got {value!r}")
        if self.base_channels % 2**stages:
            raise ValueError(
                f"HiFTConfig.base_channels: {self.base_channels} not divisible by 2^{stages}"
            )

    def _check_causal(self) -> None:
        if self.nb_harmonics != REFERENCE_HARMONICS - 1:
            raise ValueError("HiFTConfig.nb_harmonics: the causal reference's noise fixes it at 8")
        if self.sampling_rate == 22050:
            raise ValueError(
                "HiFTConfig.sampling_rate: 22050 selects the reference's non-causal SineGen"
            )
        if self.n_fft % 2:
            raise ValueError(f"HiFTConfig.n_fft: must be even, got {self.n_fft}")
        pairs = zip(self.resblock_kernel_sizes, self.resblock_dilation_sizes, strict=True)
        pairs_src = zip(
            self.source_resblock_kernel_sizes, self.source_resblock_dilation_sizes, strict=True
        )
        for name, kernels_dilations in (("resblock", pairs), ("source_resblock", pairs_src)):
            for k, dilations in kernels_dilations:
                for d in dilations:
                    if causal_padding(k, d) != (k - 1) * d:
                        raise ValueError(
                            f"HiFTConfig.{name}_kernel_sizes: kernel {k} with dilation {d} "
                            "changes the length in the reference's CausalConv1d"
                        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> HiFTConfig:
        """A `hift:` section (its `!new:`/`!ref` tags resolved): the fields above, or the
        reference's nested `istft_params` and `f0_predictor` dicts. A ValueError names an
        unknown or bad field."""
        values = dict(raw)
        istft = values.pop("istft_params", None)
        if istft is not None:
            if not isinstance(istft, Mapping) or set(istft) - {"n_fft", "hop_len"}:
                raise ValueError(f"HiFTConfig.istft_params: n_fft and hop_len only, got {istft!r}")
            values.update(istft)
        f0 = values.pop("f0_predictor", None)
        if f0 is not None:
            mel_bins = values.get("in_channels", cls.in_channels)
            if (
                not isinstance(f0, Mapping)
                or set(f0) - {"num_class", "in_channels", "cond_channels"}
                or f0.get("num_class", 1) != 1
                or f0.get("in_channels", mel_bins) != mel_bins
            ):
                raise ValueError(
                    f"HiFTConfig.f0_predictor: num_class 1, in_channels as the generator's "
                    f"and cond_channels only, got {f0!r}"
                )
            if "cond_channels" in f0:
                values["f0_cond_channels"] = f0["cond_channels"]
        names = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in names:
                raise ValueError(f"HiFTConfig.{key}: unknown field")
        for key in _INT_TUPLES + _NESTED:
            if key in values:
                values[key] = _as_tuple(key, values[key], nested=key in _NESTED)
        return cls(**values)

    @property
    def samples_per_frame(self) -> int:
        """Output samples per mel frame (480: 8 * 5 * 3 upsampling, then the iSTFT hop 4)."""
        return math.prod(self.upsample_rates) * self.hop_len

    @property
    def max_samples(self) -> int:
        """Samples of fixed noise drawn at construction (`max_seconds`)."""
        return int(self.max_seconds * self.sampling_rate)

    @property
    def stream_holdback_frames(self) -> int:
        """Trailing mel frames a `finalize=False` call does not turn into samples (8): the F0
        predictor's and `conv_pre`'s look-ahead and one frame of incomplete iSTFT overlap."""
        return F0_LOOK_RIGHT + self.conv_pre_look_right + 1

    def output_samples(self, frames: int, finalize: bool) -> int:
        """Samples `CosyVoice3HiFT.inference` returns for `frames` mel frames; they are the
        first samples of the whole utterance's (so a streamed call's new ones are those
        past what the previous calls returned). ValueError if `inference` would refuse
        the length (for being too short; too long is checked against `max_seconds`)."""
        least = 1 if finalize else self.stream_holdback_frames
        if frames < least:
            raise ValueError(
                f"mel of {frames} frames: finalize={finalize} needs at least {least} "
                f"(look-ahead {F0_LOOK_RIGHT} + {self.conv_pre_look_right} frames, 1 of overlap)"
            )
        emitted = frames if finalize else frames - self.stream_holdback_frames
        return emitted * self.samples_per_frame

    def source_samples(self, frames: int, finalize: bool) -> int:
        """Samples of excitation (hence of fixed noise) a call on `frames` frames needs."""
        return (frames - (0 if finalize else F0_LOOK_RIGHT)) * self.samples_per_frame


def _as_tuple(name: str, value: Any, nested: bool) -> tuple:
    if not isinstance(value, list | tuple) or (
        nested and not all(isinstance(v, list | tuple) for v in value)
    ):
        raise ValueError(f"HiFTConfig.{name}: a list{' of lists' if nested else ''}, got {value!r}")
    return tuple(tuple(v) for v in value) if nested else tuple(value)
