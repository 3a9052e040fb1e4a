"""CosyVoice3's causal HiFT vocoder (80-bin mel at 50 Hz -> 24 kHz waveform), in plain torch.

A port of the reference `CausalHiFTGenerator` with its `CausalConvRNNF0Predictor`
(`cosyvoice/hifigan/generator.py`, `f0_predictor.py`), inference only. This module owns
the generator and the mapping of the released `hift.pt` onto it; its config
(`HiFTConfig`, importable from here too) is in `hift_config.py`, the excitation (F0
predictor, harmonic source and its fixed noise) in `hift_source.py`, the conv blocks in
`hift_layers.py`.

    mel [1, 80, T] --f0_predictor (float64)--> F0 [1, T'] --x480 nearest--> m_source
        --> excitation [1, 1, 480 T'] --STFT(16, hop 4)--> [1, 18, 120 T' + 1]
    mel --conv_pre (looks 4 frames ahead)--> [1, 512, N]
        --(leaky_relu, causal upsample x8, x5, x3; + downsampled source; 3 ResBlocks avg)
        --> reflection pad 1 --> conv_post --> exp(magnitude), sin(phase) --> iSTFT
        --> [1, 480 N], clamped to +-0.99

Streaming follows the reference exactly: every call re-runs the whole prefix (the fixed
noise is indexed by absolute sample), and `finalize=False` treats the last 3 + 4 frames
as look-ahead context and drops one more frame (480 samples) whose iSTFT overlap is still
incomplete, so it returns `480 (T - 8)` samples that equal those of a `finalize=True` run
on the whole mel; `finalize=True` returns `480 T`. `HiFTConfig.output_samples` says so.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.cosyvoice3.hift_config import HiFTConfig
from omnistage.families.cosyvoice3.hift_layers import (
    CausalConv1d,
    CausalDownsampleConv1d,
    CausalUpsampleConv1d,
    ResBlock,
    consume_init_weights,
)
from omnistage.families.cosyvoice3.hift_source import (
    F0_LOOK_RIGHT,
    CausalF0Predictor,
    CausalHarmonicSource,
)

__all__ = ["CosyVoice3HiFT", "HiFTConfig"]

# Checkpoint spellings of a weight-normed `<module>.weight`: (suffix, part).
_WEIGHT_NORM_SUFFIXES = (
    ("parametrizations.weight.original0", "g"),
    ("parametrizations.weight.original1", "v"),
    ("weight_g", "g"),
    ("weight_v", "v"),
)


class CosyVoice3HiFT(nn.Module):
    """The causal HiFT generator; module and parameter names equal the reference's.

    Build it where the reference builds `hift` (after the flow model, from the same global
    RNG state): construction replays the reference's RNG draws so that the fixed source
    noise is the same. `load_state_dict` takes `hift.pt` as released (weight norm in the
    `parametrizations` or the `weight_g`/`weight_v` form, `generator.` prefixes or not) and
    folds the weight norm into plain weights, also when this module is a child of the one
    being loaded; the F0 predictor is held (and its weight norm folded) in float64.
    """

    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        # Reference order: the F0 predictor is built first (a constructor argument), then
        # the generator's modules in its __init__ order; init_weights on ups and conv_post.
        f0_predictor = CausalF0Predictor(c.in_channels, c.f0_cond_channels)
        self.m_source = CausalHarmonicSource(
            sampling_rate=c.sampling_rate,
            upsample_scale=c.samples_per_frame,
            sine_amp=c.nsf_alpha,
            noise_std=c.nsf_sigma,
            voiced_threshold=c.nsf_voiced_threshold,
            max_samples=c.max_samples,
        )
        self.conv_pre = CausalConv1d(
            c.in_channels, c.base_channels, c.conv_pre_look_right + 1, look_right=True
        )
        channels = [c.base_channels // 2**i for i in range(len(c.upsample_rates) + 1)]
        self.ups = nn.ModuleList(
            CausalUpsampleConv1d(channels[i], channels[i + 1], k, u)
            for i, (u, k) in enumerate(zip(c.upsample_rates, c.upsample_kernel_sizes, strict=True))
        )
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        # Stage i sees the source STFT downsampled by the product of the later stages' rates.
        down_rates = [math.prod(c.upsample_rates[i + 1 :]) for i in range(len(c.upsample_rates))]
        source = zip(
            down_rates,
            c.source_resblock_kernel_sizes,
            c.source_resblock_dilation_sizes,
            strict=True,
        )
        for i, (rate, k, d) in enumerate(source):
            if rate == 1:
                self.source_downs.append(CausalConv1d(c.n_fft + 2, channels[i + 1], 1))
            else:
                self.source_downs.append(CausalDownsampleConv1d(c.n_fft + 2, channels[i + 1], rate))
            self.source_resblocks.append(ResBlock(channels[i + 1], k, d))
        self.resblocks = nn.ModuleList(
            ResBlock(channels[i + 1], k, d)
            for i in range(len(c.upsample_rates))
            for k, d in zip(c.resblock_kernel_sizes, c.resblock_dilation_sizes, strict=True)
        )
        self.conv_post = CausalConv1d(channels[-1], c.n_fft + 2, 7)
        consume_init_weights(self.ups)
        consume_init_weights([self.conv_post])
        window = torch.hann_window(c.n_fft, periodic=True, dtype=torch.float64)
        self.register_buffer("stft_window", window.to(torch.float32), persistent=False)
        self.f0_predictor = f0_predictor.to(torch.float64)
        self.register_load_state_dict_pre_hook(_fold_checkpoint)

    def output_samples(self, frames: int, finalize: bool) -> int:
        """See `HiFTConfig.output_samples`."""
        return self.config.output_samples(frames, finalize)

    def inference(self, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        """Mel `[1, in_channels, T]` (float) -> waveform `[1, output_samples(T, finalize)]`.

        `finalize=False`: the last `stream_holdback_frames` frames are look-ahead context;
        the samples returned equal (to float rounding, ~1e-6) the first ones of any call on
        a longer mel that starts with this one. Runs under `torch.inference_mode`.
        ValueError for a wrong shape, too few frames, or more excitation than the
        reference's 300 s of fixed noise.
        """
        self._check_mel(mel, finalize)
        if self.f0_predictor.classifier.weight.dtype != torch.float64:
            self.f0_predictor.to(torch.float64)  # undo a cast of the whole module
        with torch.inference_mode():
            return self._generate(mel.to(self.conv_pre.weight.dtype), finalize)

    def _generate(self, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        """CausalHiFTGenerator.inference, once the input is checked."""
        f0 = self.f0_predictor(mel.to(torch.float64), finalize=finalize).to(mel)
        f0 = F.interpolate(f0[:, None], scale_factor=float(self.config.samples_per_frame))
        source = self.m_source(f0.transpose(1, 2)).transpose(1, 2)
        if not finalize:
            mel = mel[:, :, :-F0_LOOK_RIGHT]
        return self._decode(mel, source, finalize)

    def _check_mel(self, mel: torch.Tensor, finalize: bool) -> None:
        c = self.config
        if mel.dim() != 3 or mel.shape[0] != 1 or mel.shape[1] != c.in_channels:
            raise ValueError(f"mel: expected [1, {c.in_channels}, T], got {list(mel.shape)}")
        if not mel.is_floating_point():
            raise ValueError(f"mel: expected a float tensor, got {mel.dtype}")
        frames = mel.shape[2]
        c.output_samples(frames, finalize)
        self.m_source.reserve_samples(c.source_samples(frames, finalize))

    def _decode(self, x: torch.Tensor, source: torch.Tensor, finalize: bool) -> torch.Tensor:
        """CausalHiFTGenerator.decode: mel `[1, C, N (+ look-ahead)]`, excitation `[1, 1, L]`."""
        c = self.config
        spec = torch.view_as_real(
            torch.stft(
                source.squeeze(1),
                c.n_fft,
                c.hop_len,
                c.n_fft,
                window=self.stft_window,
                return_complex=True,
            )
        )
        s_real, s_imag = spec[..., 0], spec[..., 1]
        x = self.conv_pre(x, pad=finalize)
        if not finalize:
            # Drop the STFT frames of the look-ahead mel frames (hop frames per mel frame).
            cut = math.prod(c.upsample_rates) * c.conv_pre_look_right
            s_real, s_imag = s_real[:, :, :-cut], s_imag[:, :, :-cut]
        s_stft = torch.cat([s_real, s_imag], dim=1)

        kernels = len(c.resblock_kernel_sizes)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, c.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            xs = self.resblocks[i * kernels](x)
            for j in range(1, kernels):
                xs += self.resblocks[i * kernels + j](x)
            x = xs / kernels

        x = self.conv_post(F.leaky_relu(x))
        bins = c.n_fft // 2 + 1
        magnitude = torch.clip(torch.exp(x[:, :bins, :]), max=1e2)
        phase = torch.sin(x[:, bins:, :])  # the reference's; sin is redundant before cos/sin
        spectrum = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        audio = torch.istft(spectrum, c.n_fft, c.hop_len, c.n_fft, window=self.stft_window)
        if not finalize:
            audio = audio[:, : -c.samples_per_frame]
        return torch.clamp(audio, -c.audio_limit, c.audio_limit)


def _fold_checkpoint(
    module: nn.Module, state_dict: dict[str, torch.Tensor], prefix: str, *_: Any
) -> None:
    """Load-time pre-hook: rewrite, in place, this module's keys of the (copied) state dict
    into plain weights: strip `generator.`, fold weight-norm pairs `(g, v)` into
    `_weight_norm(v, g, 0)` computed in the target parameter's dtype (float64 for the F0
    predictor, as the reference computes it after `.to(float64)`)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key in [k for k in state_dict if k.startswith(prefix)]:
        name = key[len(prefix) :].replace("generator.", "")
        value = state_dict.pop(key)
        for suffix, part in _WEIGHT_NORM_SUFFIXES:
            if name.endswith("." + suffix):
                pairs.setdefault(name[: -len(suffix)] + "weight", {})[part] = value
                break
        else:
            state_dict[prefix + name] = value
    params = dict(module.named_parameters())
    for name, parts in pairs.items():
        if set(parts) != {"g", "v"}:
            raise ValueError(f"{prefix}{name}: a weight-norm checkpoint needs both g and v")
        dtype = params[name].dtype if name in params else parts["v"].dtype
        g, v = parts["g"].to(dtype), parts["v"].to(dtype)
        state_dict[prefix + name] = torch._weight_norm(v, g, 0)
