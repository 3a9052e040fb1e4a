"""Ming-Omni's audio encoder: FunASR's SANM encoder (`audio.*`) and the audio projector
(`linear_proj_audio.*`), as the reference's `extract_audio_feature` runs them on one clip.

Read from FunASR 1.2.6 (`funasr/models/sanm/encoder.py` `SANMEncoder`,
`sanm/attention.py` `MultiHeadedAttentionSANM`, `transformer/embedding.py`
`SinusoidalPositionEncoder`) and inclusionAI/Ming (`modeling_bailingmm.py`,
`modeling_utils.encode_audio_segments`, commit 4876ed4), same weight names:

- input scaled by `sqrt(output_size)`, then (`input_layer: "pe"`) sinusoidal positions
  1..T over the input width (`log(10000) / (d / 2 - 1)` increments, sin then cos);
- `encoders0` (one layer, input width -> output width: no residual around its attention)
  then `encoders` (`num_blocks - 1` layers); pre-norm (LayerNorm, eps 1e-12);
- SANM attention: one `linear_q_k_v`, scaled dot product over the clip, `linear_out`,
  plus the FSMN memory: a depthwise `fsmn_block` conv (`kernel_size`, left pad
  `(k - 1) // 2 + sanm_shfit`) over the values, plus the values; feed-forward
  `w_1` -> ReLU -> `w_2`; `after_norm` at the end;
- the projector: `Conv1d(audio_encoder_output_size, hidden, ds_kernel_size, ds_stride,
  padding k // 2)` then `mlp_depth - 1` times (GELU, `Linear(hidden, hidden)`),
  and `F.normalize` over the rows when `norm_query_embeds`.

One clip runs alone (no padding, so the reference's masks are all ones). A stride other
than 1 is refused: the reference keeps the encoder's length for the projected rows and
fails on a shorter projection.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.loader import iter_weights

PREFIXES = ("audio.", "linear_proj_audio.")
SANM_FIELDS = (
    "input_size",
    "output_size",
    "attention_heads",
    "linear_units",
    "num_blocks",
    "kernel_size",
    "sanm_shfit",
)


def positions(t: int, depth: int, dtype: torch.dtype) -> torch.Tensor:
    """FunASR's `SinusoidalPositionEncoder.encode` for positions 1..t, [1, t, depth]."""
    pos = torch.arange(1, t + 1).type(dtype)
    increment = torch.log(torch.tensor([10000], dtype=dtype)) / (depth / 2 - 1)
    inv = torch.exp(torch.arange(depth / 2).type(dtype) * (-increment))
    scaled = pos.reshape(1, -1, 1) * inv.reshape(1, 1, -1)
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=2).type(dtype)


class SanmAttention(nn.Module):
    """`MultiHeadedAttentionSANM` without a mask (one clip, no padding)."""

    def __init__(self, heads: int, width_in: int, width: int, kernel: int, shift: int) -> None:
        super().__init__()
        self.heads, self.d_k = heads, width // heads
        self.linear_q_k_v = nn.Linear(width_in, width * 3)
        self.linear_out = nn.Linear(width, width)
        self.fsmn_block = nn.Conv1d(width, width, kernel, groups=width, bias=False)
        left = (kernel - 1) // 2 + max(shift, 0)
        self.pad = (left, kernel - 1 - left)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = torch.split(self.linear_q_k_v(x), self.heads * self.d_k, dim=-1)
        memory = self.fsmn_block(F.pad(v.transpose(1, 2), self.pad)).transpose(1, 2) + v
        q, k, vh = (y.reshape(b, t, self.heads, self.d_k).transpose(1, 2) for y in (q, k, v))
        scores = torch.matmul(q * self.d_k ** (-0.5), k.transpose(-2, -1))
        out = torch.matmul(torch.softmax(scores, dim=-1), vh)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, -1)) + memory


class FeedForward(nn.Module):
    """`PositionwiseFeedForward`: `w_2(relu(w_1(x)))`."""

    def __init__(self, width: int, units: int) -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(width, units), nn.Linear(units, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(torch.relu(self.w_1(x)))


class SanmLayer(nn.Module):
    """`EncoderLayerSANM` (pre-norm, no concat_after)."""

    def __init__(self, width_in: int, width: int, s: dict[str, Any]) -> None:
        super().__init__()
        heads, kernel, shift = s["attention_heads"], s["kernel_size"], s["sanm_shfit"]
        self.self_attn = SanmAttention(heads, width_in, width, kernel, shift)
        self.feed_forward = FeedForward(width, s["linear_units"])
        self.norm1 = nn.LayerNorm(width_in, eps=1e-12)
        self.norm2 = nn.LayerNorm(width, eps=1e-12)
        self.residual = width_in == width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attended = self.self_attn(self.norm1(x))
        x = x + attended if self.residual else attended
        return x + self.feed_forward(self.norm2(x))


def sanm_settings(audio_config: dict[str, Any]) -> dict[str, Any]:
    """`audio_encoder_config_sanm` with FunASR's defaults, the ported options checked."""
    given = dict(audio_config.get("audio_encoder_config_sanm") or {})
    defaults = dict(output_size=256, attention_heads=4, linear_units=2048, num_blocks=6)
    s = defaults | dict(kernel_size=11, sanm_shfit=0) | given
    if "input_size" not in s:
        raise ValueError("audio_config.audio_encoder_config_sanm.input_size: missing")
    supported = dict(
        input_layer="pe",
        normalize_before=True,
        concat_after=False,
        selfattention_layer_type="sanm",
        positionwise_layer_type="linear",
    )
    for key, value in supported.items():
        if s.get(key, "conv2d" if key == "input_layer" else value) != value:
            raise ValueError(
                f"audio_config.audio_encoder_config_sanm.{key}: {s.get(key)!r} "
                f"(only {value!r} is ported)"
            )
    for key in ("interctc_layer_idx", "lora_list"):
        if s.get(key):
            raise ValueError(f"audio_config.audio_encoder_config_sanm.{key}: not ported")
    if s["output_size"] % s["attention_heads"]:
        raise ValueError("audio_config.audio_encoder_config_sanm.attention_heads: must divide it")
    return s


class SanmEncoder(nn.Module):
    """`SANMEncoder` with `input_layer: "pe"` (the weights under `audio.`)."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        width = s["output_size"]
        self.width = width
        self.encoders0 = nn.ModuleList([SanmLayer(s["input_size"], width, s)])
        self.encoders = nn.ModuleList(
            SanmLayer(width, width, s) for _ in range(s["num_blocks"] - 1)
        )
        self.after_norm = nn.LayerNorm(width, eps=1e-12)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[1, T, input_size] -> [1, T, output_size]."""
        x = feats * self.width**0.5
        x = x + positions(x.shape[1], x.shape[2], x.dtype)
        for layer in (*self.encoders0, *self.encoders):
            x = layer(x)
        return self.after_norm(x)


class MingAudioEncoder(nn.Module):
    """Audio features of one clip -> the thinker's rows (see the module docstring)."""

    def __init__(self, audio_config: dict[str, Any], hidden_size: int, mlp_depth: int) -> None:
        super().__init__()
        if int(audio_config.get("ds_stride", 1)) != 1:
            raise ValueError("audio_config.ds_stride: only 1 (the reference fails on others)")
        if audio_config.get("ds_conv_type", "conv") != "conv":
            raise ValueError("audio_config.ds_conv_type: only 'conv' is ported")
        s = sanm_settings(audio_config)
        self.audio = SanmEncoder(s)
        width = int(audio_config.get("audio_encoder_output_size", 512))
        kernel = int(audio_config.get("ds_kernel_size", 1))
        layers: list[nn.Module] = [nn.Conv1d(width, hidden_size, kernel, 1, kernel // 2), _T()]
        for _ in range(1, mlp_depth):
            layers += [nn.GELU(), nn.Linear(hidden_size, hidden_size)]
        self.linear_proj_audio = nn.Sequential(*layers, _T())
        self.normalize = bool(audio_config.get("norm_query_embeds", True))

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, config: Any, dtype: torch.dtype
    ) -> MingAudioEncoder:
        """The encoder of a Ming checkpoint, every `audio.*` / `linear_proj_audio.*` weight
        loaded (a missing, extra or misshapen one is a ValueError)."""
        model = cls(config.audio_config, config.llm_config.hidden_size, config.mlp_depth)
        state = dict(iter_weights(path, PREFIXES))
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise ValueError(f"{os.fspath(path)}: audio encoder weights: {e}") from e
        return model.to(dtype).eval()

    def num_tokens(self, frames: int) -> int:
        """Rows for a clip of `frames` feature frames (stride 1: as many)."""
        return frames

    @torch.no_grad()
    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """[T, input_size] features -> [T, hidden] float32 rows."""
        dtype = next(self.parameters()).dtype
        encoded = self.audio(feats.to(dtype).unsqueeze(0))
        rows = self.linear_proj_audio(encoded.transpose(-1, -2)).transpose(-1, -2)[0].float()
        return F.normalize(rows, dim=-1) if self.normalize else rows


class _T(nn.Module):
    """The reference's `Transpose(-1, -2)` (a placeholder index in `linear_proj_audio`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2)
