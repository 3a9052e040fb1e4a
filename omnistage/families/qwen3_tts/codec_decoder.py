"""The Qwen3-TTS 12 Hz speech tokenizer's decoder (codes -> 24 kHz waveform), in plain torch.

A port of the reference `Qwen3TTSTokenizerV2Decoder` (PyPI `qwen-tts`): the split
residual vector-quantizer decode (`codec_quantizer`), a causal conv, a small transformer
(RMSNorm, RoPE, causal sliding-window attention, SwiGLU MLP, layer scale), two ConvNeXt
upsampling stages, then the SnakeBeta / transposed-conv vocoder blocks, clamped to
[-1, 1]. Every module and parameter name equals the reference's, so the `decoder.*`
tensors of `speech_tokenizer/model.safetensors` load as they are. This module owns the
network (but the quantizer, `codec_quantizer`, and the causal convolutions and SnakeBeta,
`codec_convs`) and its config (`CodecDecoderConfig`, read from the
`decoder_config` dict of the speech tokenizer's `config.json`).

Every convolution is causal and the transposed ones are cut to `stride * length`, so
`n` frames decode to exactly `n * total_upsample` samples and output sample `s`
depends on frames `<= s // total_upsample` only. A stream's chunks decode one after
another through a `DecoderStream` (`codec_stream`) without re-decoding earlier frames.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.qwen3_tts.codec_convs import CausalConvNet, CausalTransConvNet, SnakeBeta
from omnistage.families.qwen3_tts.codec_quantizer import (
    EuclideanCodebook,
    SplitResidualVectorQuantizer,
)
from omnistage.families.qwen3_tts.codec_stream import DecoderStream, last, window_mask

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


@dataclasses.dataclass(frozen=True)
class CodecDecoderConfig:
    """The `decoder_config` of `speech_tokenizer/config.json`; defaults as the reference's
    `Qwen3TTSTokenizerV2DecoderConfig` (which has none for `codebook_dim`: 512 here, the
    released model's)."""

    codebook_size: int = 2048
    codebook_dim: int = 512
    hidden_size: int = 1024
    latent_dim: int = 1024
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 8000
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CodecDecoderConfig:
        """The known keys of a `decoder_config` dict (others, e.g. `semantic_codebook_size`,
        are not read by the decoder); a ValueError names a field the port cannot honour."""
        scaling = raw.get("rope_scaling")
        if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (
            None,
            "default",
        ):
            raise ValueError(f"decoder_config.rope_scaling: only default RoPE, got {scaling}")
        if raw.get("hidden_act", "silu") not in _ACTIVATIONS:
            raise ValueError(f"decoder_config.hidden_act: unsupported {raw['hidden_act']!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in raw.items() if k in names}
        for key in ("upsample_rates", "upsampling_ratios"):
            if key in values:
                values[key] = tuple(int(r) for r in values[key])
        config = cls(**values)
        if config.num_quantizers < 2:
            raise ValueError("decoder_config.num_quantizers: needs 1 semantic + acoustic ones")
        if config.num_attention_heads % config.num_key_value_heads:
            raise ValueError("decoder_config.num_key_value_heads: must divide the head count")
        return config

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def total_upsample(self) -> int:
        """Waveform samples per code frame."""
        return math.prod(self.upsample_rates + self.upsampling_ratios)


KEPT_TABLES = 16
"""Lengths whose rotary tables and attention mask the decoder's transformer keeps."""


# --- convolution blocks ---------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConvNet(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(1e-6 * torch.ones(dim))

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        h = self.norm(self.dwconv(x, stream).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConvNet(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConvNet(dim, dim, kernel_size=1)

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), stream)))


class DecoderBlock(nn.Module):
    """SnakeBeta, a transposed conv upsampling by `rate` (halving the channels), then
    residual units with dilations 1, 3, 9."""

    def __init__(self, config: CodecDecoderConfig, index: int) -> None:
        super().__init__()
        in_dim = config.decoder_dim // 2**index
        out_dim = config.decoder_dim // 2 ** (index + 1)
        rate = config.upsample_rates[index]
        units = [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalTransConvNet(in_dim, out_dim, 2 * rate, rate), *units]
        )

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x) if isinstance(layer, SnakeBeta) else layer(x, stream)
        return x


# --- transformer --------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.scale = nn.Parameter(
            torch.full((config.hidden_size,), config.layer_scale_initial_scale)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Mlp(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = _ACTIVATIONS[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.head_dim = config.attention_head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        self.sliding_window = config.sliding_window

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        stream: DecoderStream | None = None,
    ) -> torch.Tensor:
        """`x` `[B, T, hidden]`; `cos`/`sin` `[T, head_dim]`; `mask` `[T, P + T]` (True:
        attend) over the `P` keys a `stream` kept, then the chunk's own."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if stream is not None:
            kept = stream.tail(self)
            if kept is not None:
                k, v = torch.cat([kept[0], k], 2), torch.cat([kept[1], v], 2)
            window = self.sliding_window - 1
            stream.keep(self, (last(k, window, 2), last(v, window, 2)))
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = Mlp(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(config)
        self.mlp_layer_scale = LayerScale(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        stream: DecoderStream | None = None,
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, mask, stream)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class DecoderTransformer(nn.Module):
    """`latent_dim` in and out; each frame attends to itself and the `sliding_window - 1`
    frames before it."""

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [TransformerLayer(config) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.sliding_window = config.sliding_window
        dim = config.attention_head_dim
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        inv_freq = 1.0 / (config.rope_theta**exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._kept_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _rope(
        self, length: int, dtype: torch.dtype, start: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of positions start..start+length-1, in float32 (as the reference)."""
        device = self.inv_freq.device
        positions = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq.float())
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _tables(self, length: int, dtype: torch.dtype, device: torch.device) -> tuple:
        """cos, sin and the causal sliding-window mask of `length` frames. Without
        autograd they are kept per (length, dtype, device) until `inv_freq` changes: a
        stream decodes chunks of a few lengths, each chunk in one call."""
        keep = not torch.is_grad_enabled()  # an autograd pass neither reads nor keeps them
        key = (length, dtype, device, self.inv_freq.data_ptr(), self.inv_freq._version)
        tables = self._kept_tables.get(key) if keep else None
        if tables is None:
            cos, sin = self._rope(length, dtype)
            pos = torch.arange(length, device=device)
            offset = pos[:, None] - pos[None, :]  # query - key
            tables = (cos, sin, (offset >= 0) & (offset < self.sliding_window))
            if keep:
                if len(self._kept_tables) >= KEPT_TABLES:
                    self._kept_tables.clear()
                self._kept_tables[key] = tables
        return tables

    def forward(self, x: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        """`[B, T, latent_dim]` -> `[B, T, latent_dim]` (a `stream`'s next T frames)."""
        x = self.input_proj(x)
        if stream is None:
            cos, sin, mask = self._tables(x.shape[1], x.dtype, x.device)
        else:  # positions go on from the stream's; its kept keys come first
            cos, sin = self._rope(x.shape[1], x.dtype, stream.frames)
            past = min(stream.frames, self.sliding_window - 1)
            mask = window_mask(past, x.shape[1], self.sliding_window, x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, stream)
        return self.output_proj(self.norm(x))


# --- the decoder --------------------------------------------------------------------------


class Qwen3TTSCodecDecoder(nn.Module):
    """`[B, num_quantizers, T]` codes -> `[B, 1, T * total_upsample]` waveform in [-1, 1]."""

    def __init__(self, config: CodecDecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.total_upsample = config.total_upsample
        self.quantizer = SplitResidualVectorQuantizer(
            config.num_quantizers, config.codebook_dim, config.codebook_size
        )
        self.pre_conv = CausalConvNet(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = DecoderTransformer(config)
        latent = config.latent_dim
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [CausalTransConvNet(latent, latent, factor, factor), ConvNeXtBlock(latent)]
            )
            for factor in config.upsampling_ratios
        )
        blocks = len(config.upsample_rates)
        out_dim = config.decoder_dim // 2**blocks
        self.decoder = nn.ModuleList(
            [
                CausalConvNet(latent, config.decoder_dim, kernel_size=7),
                *(DecoderBlock(config, i) for i in range(blocks)),
                SnakeBeta(out_dim),
                CausalConvNet(out_dim, 1, kernel_size=7),
            ]
        )

    def refresh_codebooks(self) -> None:
        """Recompute the codebook entries (done on `load_state_dict`; call it after
        changing `cluster_usage` / `embedding_sum` in place)."""
        for module in self.modules():
            if isinstance(module, EuclideanCodebook):
                module.refresh()

    def forward(self, codes: torch.Tensor, stream: DecoderStream | None = None) -> torch.Tensor:
        """The samples of `codes`; with a `stream`, the samples of the frames that follow
        the ones it has decoded (it keeps what the next chunk needs)."""
        if codes.ndim != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(
                f"codes: expected [batch, {self.config.num_quantizers}, frames], "
                f"got {list(codes.shape)}"
            )
        hidden = self.pre_conv(self.quantizer.decode(codes), stream)
        hidden = self.pre_transformer(hidden.transpose(1, 2), stream).transpose(1, 2)
        for stage in self.upsample:
            for layer in stage:
                hidden = layer(hidden, stream)
        for layer in self.decoder:
            hidden = layer(hidden) if isinstance(layer, SnakeBeta) else layer(hidden, stream)
        if stream is not None:
            stream.frames += codes.shape[-1]
        return hidden.clamp(min=-1, max=1)
