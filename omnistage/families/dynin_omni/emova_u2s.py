"""EMOVA's unit-to-speech decoder (the U2S half of the EMOVA speech tokenizer, a VITS
`SynthesizerTrn` under `decoder.*` plus the style table `style_embedding.weight`), which
Dynin-Omni's token2audio runs on its speech units (vLLM-Omni's Dynin loads
`snu-aidas/emova_speech_tokenizer_vllm`, a copy of `Emova-ollm/emova_speech_tokenizer_hf`).

What the reference's `synthesis_from_content_unit_style_embedding` does, for one sequence:
units -> symbol ids (the numbers come last in UVITS's `symbols_with_4096`, so unit u is
symbol `num_symbols - n_units + u`) -> the unit encoder (prior mean and log-std) -> the
stochastic duration predictor, reversed from noise scaled by 0.8 -> each unit's frames
(ceil of the durations) -> a prior sample with noise scaled by 0.667 -> the reversed
coupling flow -> HiFi-GAN. The style (a condition such as
`gender-female_emotion-neutral_speed-normal_pitch-normal`, Dynin's default) conditions
the duration predictor, the flow and the generator.

Checkpoint layout read here (`vq_model_audio/`): `config.json` with the HF config's
fields (`u2s_num_styles`, `u2s_dim_styles`, `u2s_style2idx`) and the UVITS
hyper-parameters under `u2s_config` (`num_symbols`, `sampling_rate`, `model`: UVITS's
`hps.model` keys); `model.safetensors` in UVITS's parameter names with weight norm stored
as `weight_g`/`weight_v` (fused on load). Training-only weights (`enc_q`, `enc_r`,
`emb_g`, the duration predictor's posterior flows) are skipped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.families.dynin_omni.hifigan import Generator
from omnistage.families.dynin_omni.vits_flows import CouplingFlow, StochasticDurationPredictor
from omnistage.families.dynin_omni.vits_layers import Encoder

VQ_AUDIO_DIR = "vq_model_audio"
DEFAULT_STYLE = "gender-female_emotion-neutral_speed-normal_pitch-normal"
NOISE_SCALE, NOISE_SCALE_W, LENGTH_SCALE = 0.667, 0.8, 1.0
"""The reference's synthesis settings (`speech_utils.synthesis`)."""
TRAINING_ONLY = ("decoder.enc_q.", "decoder.enc_r.", "decoder.emb_g", "decoder.dp.post_")


@dataclass(frozen=True)
class U2SConfig:
    num_symbols: int
    sampling_rate: int
    num_styles: int
    style_dim: int
    style2idx: dict[str, int]
    model: dict[str, Any]
    """UVITS `hps.model`: inter/hidden/filter_channels, n_heads, n_layers, kernel_size,
    resblock*, upsample*, gin_channels, use_sdp."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> U2SConfig:
        u2s = raw.get("u2s_config")
        if not isinstance(u2s, dict) or not isinstance(u2s.get("model"), dict):
            raise ValueError("u2s_config: the speech decoder's config names no UVITS model")
        model = dict(u2s["model"])
        if not model.get("use_sdp", True):
            raise ValueError("use_sdp: only the stochastic duration predictor is served")
        if int(model["gin_channels"]) != int(raw["u2s_dim_styles"]):
            raise ValueError("u2s_dim_styles: the style size must equal gin_channels")
        return cls(
            num_symbols=int(u2s["num_symbols"]),
            sampling_rate=int(u2s["sampling_rate"]),
            num_styles=int(raw["u2s_num_styles"]),
            style_dim=int(raw["u2s_dim_styles"]),
            style2idx={str(k): int(v) for k, v in (raw.get("u2s_style2idx") or {}).items()},
            model=model,
        )

    @classmethod
    def read(cls, path: Path) -> U2SConfig:
        file = Path(path) / VQ_AUDIO_DIR / "config.json"
        if not file.is_file():
            raise ValueError(f"{path}: no EMOVA speech decoder ({VQ_AUDIO_DIR}/config.json)")
        return cls.from_dict(json.loads(file.read_text()))


class UnitEncoder(nn.Module):
    """UVITS `TextEncoder` (`enc_p`): symbol embedding, encoder, prior statistics."""

    def __init__(self, n_symbols: int, m: dict[str, Any]) -> None:
        super().__init__()
        self.hidden, self.out = int(m["hidden_channels"]), int(m["inter_channels"])
        self.emb = nn.Embedding(n_symbols, self.hidden)
        self.encoder = Encoder(
            self.hidden, m["filter_channels"], m["n_heads"], m["n_layers"], m["kernel_size"]
        )
        self.proj = nn.Conv1d(self.hidden, 2 * self.out, 1)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.encoder((self.emb(ids) * math.sqrt(self.hidden)).transpose(1, -1))
        m, logs = torch.split(self.proj(x), self.out, dim=1)
        return x, m, logs


class UnitDecoder(nn.Module):
    """The inference parts of UVITS `SynthesizerTrn` (`decoder.*`)."""

    def __init__(self, cfg: U2SConfig) -> None:
        super().__init__()
        m, gin = cfg.model, int(cfg.model["gin_channels"])
        self.enc_p = UnitEncoder(cfg.num_symbols, m)
        self.dp = StochasticDurationPredictor(int(m["hidden_channels"]), 3, gin)
        self.flow = CouplingFlow(int(m["inter_channels"]), int(m["hidden_channels"]), gin)
        self.dec = Generator(
            int(m["inter_channels"]),
            str(m["resblock"]),
            list(m["resblock_kernel_sizes"]),
            [list(d) for d in m["resblock_dilation_sizes"]],
            list(m["upsample_rates"]),
            int(m["upsample_initial_channel"]),
            list(m["upsample_kernel_sizes"]),
            gin,
        )


class EmovaU2S(nn.Module):
    def __init__(self, cfg: U2SConfig, n_units: int) -> None:
        super().__init__()
        if cfg.num_symbols < n_units:
            raise ValueError(
                f"num_symbols: {cfg.num_symbols} symbols hold no {n_units} speech units"
            )
        self.cfg, self.unit_offset = cfg, cfg.num_symbols - n_units
        self.style_embedding = nn.Embedding(cfg.num_styles, cfg.style_dim)
        self.decoder = UnitDecoder(cfg)

    def style_index(self, style: str | None) -> int:
        """The style table row of a condition (None: Dynin's default condition)."""
        name = DEFAULT_STYLE if style is None else style
        if name not in self.cfg.style2idx:
            if style is None:
                return 0
            known = ", ".join(sorted(self.cfg.style2idx)[:4])
            raise ValueError(f"speaker: {style!r} is no style of the speech decoder ({known}, …)")
        return self.cfg.style2idx[name]

    def synthesize(
        self, units: torch.Tensor, style: int, generator: torch.Generator
    ) -> torch.Tensor:
        """The waveform (1-D, in [-1, 1]) of one sequence of speech units."""
        dtype = self.style_embedding.weight.dtype
        d = self.decoder
        x, m_p, logs_p = d.enc_p((units.long() + self.unit_offset)[None])
        g = self.style_embedding.weight[style].view(1, -1, 1)
        noise_w = torch.randn((1, 2, x.shape[2]), generator=generator).to(dtype) * NOISE_SCALE_W
        logw = d.dp(x, g, noise_w)
        frames = torch.ceil(torch.exp(logw) * LENGTH_SCALE)[0, 0].long()
        m_p = torch.repeat_interleave(m_p, frames, dim=2)
        logs_p = torch.repeat_interleave(logs_p, frames, dim=2)
        # The reference's randn_like(m_p) keeps m_p's transposed (time-major) layout, and
        # torch draws a strided tensor's normals in another order than a contiguous one's.
        b, c, t = m_p.shape
        noise = torch.empty((b, t, c)).transpose(1, 2).normal_(generator=generator).to(dtype)
        z = d.flow(m_p + noise * torch.exp(logs_p) * NOISE_SCALE, g)
        return d.dec(z, g)[0, 0]


def fuse_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weight_g`/`weight_v` pairs (torch weight norm, dim 0) as plain `weight`s."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".weight_g"):
            continue
        if name.endswith(".weight_v"):
            base = name[: -len("_v")]
            out[base] = torch._weight_norm(tensor, state[f"{base}_g"], 0)
        else:
            out[name] = tensor
    return out


def load_emova_u2s(path: Path, n_units: int, dtype: torch.dtype) -> EmovaU2S:
    """The speech decoder of a Dynin-Omni checkpoint folder (`vq_model_audio/`)."""
    from safetensors.torch import load_file

    cfg = U2SConfig.read(path)
    model = EmovaU2S(cfg, n_units)
    raw = load_file(str(Path(path) / VQ_AUDIO_DIR / "model.safetensors"))
    state = {k: v for k, v in fuse_weight_norm(raw).items() if not k.startswith(TRAINING_ONLY)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: EMOVA speech decoder weights do not match (missing "
            f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return model.to(dtype).eval()
