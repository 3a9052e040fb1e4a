"""Ming-flash-omni-2.0's audio encoder: the Whisper encoder (`audio.*`), its projector
(`linear_proj_audio.*`) and the log-mel features they read, as the reference's
`extract_audio_feature` runs them on one clip.

What the reference builds (inclusionAI/Ming, flash-omni-2.0: `modeling_bailingmm2.py`,
`modeling_utils.encode_audio_segments`, `audio_processing_bailingmm2.py`
`WhisperFrontend`; its `modeling_whisper_encoder.WhisperAudioEncoder` subclasses
openai-whisper's `AudioEncoder`, read from the code index):

- features: `whisper.log_mel_spectrogram(wave, n_mels)` (`n_mels` of
  `whisper_encoder_config`, 128): a 400-point Hann STFT every 160 samples (centered,
  reflect-padded, the last frame dropped), power, Slaney mel filters, log10 floored at
  1e-10, floored again at the clip's maximum - 8, then (x + 4) / 4; no 30 s padding.
  Here transformers' `WhisperFeatureExtractor` computes them (the same recipe; its mel
  filters are librosa's, which whisper's `mel_filters.npz` holds);
- the encoder: GELU(`conv1`, k 3) -> GELU(`conv2`, k 3, stride 2) -> + the first T'
  rows of the sinusoidal `positional_embedding` (openai-whisper's `sinusoids(n_ctx,
  n_state)`, a buffer; loaded when the checkpoint has it) -> `n_layer` pre-norm blocks
  (`attn_ln`, attention with `query` / `key` (no bias) / `value` / `out`; `mlp_ln`,
  `mlp.0` -> GELU -> `mlp.2`) -> `ln_post`. LayerNorms run in float32, as whisper's do;
- the projector: `Conv1d(n_state, hidden, ds_kernel_size, ds_stride, padding k // 2)`,
  then `mlp_depth - 1` times (GELU, `Linear(hidden, hidden)`) over the rows (the
  reference's `nn.Sequential` with `Transpose` modules, so the weight names are
  `linear_proj_audio.0.*`, `linear_proj_audio.3.*`, ...), then `F.normalize` per row
  when `norm_query_embeds`;
- the clip's row count: `((T - 1) // 2 + 1 - k + 2 (k // 2)) // stride + 1`, what
  `encode_audio_segments` computes (the processor's placeholder count assumes k 3,
  stride 2; other values are refused, see `check_audio_config`).

One clip runs alone (no padding, so no mask), as the reference runs a one-clip prompt.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.loader import iter_weights

PREFIXES = ("audio.", "linear_proj_audio.")
WHISPER_FIELDS = ("n_mels", "n_ctx", "n_state", "n_head", "n_layer")
SAMPLE_RATE = 16000


def check_audio_config(audio_config: dict[str, Any]) -> dict[str, int]:
    """The Whisper dims of `audio_config.whisper_encoder_config` (ValueErrors name a
    missing or unservable field)."""
    whisper = audio_config.get("whisper_encoder_config")
    if not isinstance(whisper, dict):
        raise ValueError("audio_config.whisper_encoder_config: missing")
    for field in WHISPER_FIELDS:
        if not isinstance(whisper.get(field), int) or whisper[field] < 1:
            raise ValueError(f"audio_config.whisper_encoder_config.{field}: missing")
    if whisper["n_state"] % whisper["n_head"] or whisper["n_state"] % 2:
        raise ValueError("audio_config.whisper_encoder_config.n_head: must divide n_state")
    for field, want in (("ds_kernel_size", 3), ("ds_stride", 2)):
        if audio_config.get(field, want) != want:
            raise ValueError(
                f"audio_config.{field}: {audio_config[field]!r}; the reference's processor "
                f"counts the placeholders for {want} only"
            )
    return {k: whisper[k] for k in WHISPER_FIELDS}


def sinusoids(length: int, channels: int) -> torch.Tensor:
    """openai-whisper's `sinusoids` (max timescale 10000), [length, channels]."""
    increment = np.log(10000) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2))
    scaled = torch.arange(length)[:, np.newaxis] * inv[np.newaxis, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class LayerNorm32(nn.LayerNorm):
    """whisper's LayerNorm: computed in float32, returned in the input's dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(
            x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps
        ).to(x.dtype)


class WhisperAttention(nn.Module):
    """whisper's `MultiHeadAttention` over one clip (no mask)."""

    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            p(x).view(b, t, self.n_head, -1).permute(0, 2, 1, 3)
            for p in (self.query, self.key, self.value)
        )
        a = F.scaled_dot_product_attention(q, k, v)
        return self.out(a.permute(0, 2, 1, 3).flatten(start_dim=2))


class WhisperBlock(nn.Module):
    """whisper's `ResidualAttentionBlock` without cross-attention."""

    def __init__(self, n_state: int, n_head: int) -> None:
        super().__init__()
        self.attn = WhisperAttention(n_state, n_head)
        self.attn_ln = LayerNorm32(n_state)
        self.mlp = nn.Sequential(
            nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state)
        )
        self.mlp_ln = LayerNorm32(n_state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class WhisperEncoder(nn.Module):
    """The reference's `WhisperAudioEncoder` (openai-whisper's names under `audio.`)."""

    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList(WhisperBlock(n_state, n_head) for _ in range(n_layer))
        self.ln_post = LayerNorm32(n_state)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[B, T, n_mels] -> [B, T', n_state]."""
        x = F.gelu(self.conv1(feats.transpose(1, 2)))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        x = x + self.positional_embedding[: x.shape[1]].to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


class Transpose(nn.Module):
    """The reference's `modeling_utils.Transpose` (it holds no weights; it keeps the
    projector's module indices, and so its weight names, the reference's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2)


def projector(n_state: int, hidden: int, mlp_depth: int, kernel: int, stride: int) -> nn.Module:
    """`linear_proj_audio`: [B, n_state, T'] -> [B, hidden, T'']."""
    layers: list[nn.Module] = [
        nn.Conv1d(n_state, hidden, kernel_size=kernel, stride=stride, padding=kernel // 2),
        Transpose(),
    ]
    for _ in range(1, mlp_depth):
        layers += [nn.GELU(), nn.Linear(hidden, hidden)]
    return nn.Sequential(*layers, Transpose())


class MingFlashAudioEncoder(nn.Module):
    """Log-mel features of one clip -> the thinker's audio rows (see the module
    docstring)."""

    def __init__(self, audio_config: dict[str, Any], hidden_size: int, mlp_depth: int) -> None:
        super().__init__()
        self.dims = check_audio_config(audio_config)
        self.kernel = int(audio_config.get("ds_kernel_size", 3))
        self.stride = int(audio_config.get("ds_stride", 2))
        self.normalize = bool(audio_config.get("norm_query_embeds", True))
        self.audio = WhisperEncoder(**self.dims)
        n_state = self.dims["n_state"]
        self.linear_proj_audio = projector(
            n_state, hidden_size, mlp_depth, self.kernel, self.stride
        )

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, config: Any, dtype: torch.dtype
    ) -> MingFlashAudioEncoder:
        """The encoder of a Ming-flash checkpoint (`audio.*`, `linear_proj_audio.*`); a
        ValueError names a missing or unexpected weight."""
        if not config.audio_config:
            raise ValueError(
                f"{os.fspath(path)}: audio_config: this checkpoint has no audio encoder"
            )
        enc = cls(config.audio_config, config.llm_config.hidden_size, config.mlp_depth)
        state = dict(iter_weights(path, PREFIXES))
        wanted = set(enc.state_dict())
        missing = sorted(wanted - set(state) - {"audio.positional_embedding"})
        extra = sorted(set(state) - wanted)
        if missing or extra:
            raise ValueError(
                f"{os.fspath(path)}: audio encoder weights: {missing[:3]} missing, {extra[:3]} unexpected"
            )
        enc.load_state_dict(state, strict=False)
        return enc.to(dtype).eval()

    def num_tokens(self, frames: int) -> int:
        """The rows a clip of `frames` feature frames becomes (conv2, then the projector)."""
        after_conv = (frames - 1) // 2 + 1
        pad = self.kernel // 2
        return (after_conv - self.kernel + 2 * pad) // self.stride + 1

    def max_frames(self) -> int:
        """The longest clip (feature frames) the positional table covers."""
        return 2 * self.dims["n_ctx"]

    @torch.no_grad()
    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[T, n_mels] features -> [rows, hidden] (L2-normalized when configured)."""
        dtype = self.audio.conv1.weight.dtype
        x = self.audio(feats.to(dtype).unsqueeze(0))
        rows = self.linear_proj_audio(x.transpose(-1, -2)).transpose(-1, -2)[0]
        return F.normalize(rows, dim=-1) if self.normalize else rows


def log_mel(wave: np.ndarray, n_mels: int) -> torch.Tensor:
    """[T, n_mels] whisper log-mel features of a mono 16 kHz clip (transformers'
    `WhisperFeatureExtractor`, no padding, no truncation)."""
    from transformers import WhisperFeatureExtractor

    extractor = _extractor(WhisperFeatureExtractor, n_mels)
    out = extractor(
        np.asarray(wave, dtype=np.float32),
        sampling_rate=SAMPLE_RATE,
        padding="longest",
        truncation=False,
        return_tensors="pt",
    )
    return out["input_features"][0].transpose(0, 1).contiguous()


_EXTRACTORS: dict[int, Any] = {}


def _extractor(cls: Any, n_mels: int) -> Any:
    if n_mels not in _EXTRACTORS:
        _EXTRACTORS[n_mels] = cls(feature_size=n_mels, sampling_rate=SAMPLE_RATE)
    return _EXTRACTORS[n_mels]
