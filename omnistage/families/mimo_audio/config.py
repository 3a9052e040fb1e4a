"""The configs of a MiMo-Audio checkpoint: the fused LM's and its audio tokenizer's decoder.

`MiMoAudioConfig` is the LM's `config.json`: a Qwen2 decoder's fields plus the reference's
(`mimo_audio/modeling_mimo_audio.py` `MiMoAudioConfig`): the per-channel speech vocab sizes
and empty ("zero embedding") ids as dash-joined strings, the delay pattern of the local
decoder, `group_size` (audio frames per LM position), `audio_channels` (codebooks), the
local (output) transformer and the input local transformer (the patch encoder). The
`<|empty|>` text id, which the reference takes from its tokenizer, is `empty_token_id`
here (the tiny checkpoint writes it; a real one is read from the tokenizer, `model.py`).

`AudioDecoderConfig` holds the fields of the audio tokenizer's `config.json`
(`mimo_audio_tokenizer/configuration_audio_tokenizer.py`) its decoder reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformers import Qwen2Config

MODEL_TYPE = "mimo_audio"


def parse_channels(value: str | int, channels: int, field: str) -> list[int]:
    """The reference's `_parse_maybe_list`: "a-b-c" -> [a, b, c], a single value -> it per
    channel; a ValueError naming `field` when the count is not `channels`."""
    try:
        if isinstance(value, str) and "-" in value:
            out = [int(s) for s in value.split("-")]
        else:
            out = [int(value)] * channels
    except (TypeError, ValueError) as e:
        raise ValueError(f"{field}: {value!r} is not dash-joined integers") from e
    if len(out) != channels:
        raise ValueError(f"{field}: {len(out)} values for {channels} audio_channels")
    return out


class MiMoAudioConfig(Qwen2Config):
    """The fused LM's config (Qwen2 fields plus the reference's audio fields)."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        speech_vocab_size: str | int = "1025-1025-129-129-129-129-129-129",
        speech_zeroemb_idx: str | int = "1024-1024-128-128-128-128-128-128",
        delay_pattern: str = "0-1-2-3-4-5-6-7",
        head_dim: int = 128,
        group_size: int = 4,
        audio_channels: int = 8,
        local_dim: int = 1024,
        local_layers: int = 16,
        local_attn_heads: int = 64,
        local_ffn_dim: int = 4096,
        local_attn_dropout: float = 0.1,
        input_local_layers: int = 6,
        input_local_dim: int | None = None,
        input_full_attention: bool | None = None,
        empty_token_id: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.speech_vocab_size = speech_vocab_size
        self.speech_zeroemb_idx = speech_zeroemb_idx
        self.delay_pattern = delay_pattern
        self.head_dim = head_dim
        self.group_size = group_size
        self.audio_channels = audio_channels
        self.local_dim = local_dim
        self.local_layers = local_layers
        self.local_attn_heads = local_attn_heads
        self.local_ffn_dim = local_ffn_dim
        self.local_attn_dropout = local_attn_dropout
        self.input_local_layers = input_local_layers
        self.input_local_dim = input_local_dim or local_dim
        self.input_full_attention = input_full_attention
        self.empty_token_id = empty_token_id


def rope_theta(config: Any) -> float:
    """The LM's RoPE base (transformers 5 keeps it in `rope_parameters`)."""
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def speech_vocab_sizes(config: Any) -> list[int]:
    """Per channel, its speech vocab size (codebook and empty id)."""
    return parse_channels(config.speech_vocab_size, config.audio_channels, "speech_vocab_size")


def speech_empty_ids(config: Any) -> list[int]:
    """Per channel, the id of "no speech" (one past its codebook)."""
    return parse_channels(config.speech_zeroemb_idx, config.audio_channels, "speech_zeroemb_idx")


def delays(config: Any) -> list[int]:
    """Per channel, by how many local steps its codes lag."""
    return parse_channels(config.delay_pattern, config.audio_channels, "delay_pattern")


@dataclass(frozen=True)
class LocalConfig:
    """One of the LM's small Qwen2 stacks (the reference's `local_config()` and
    `input_local_config()`: the LM's config with these fields replaced)."""

    hidden_size: int
    """Width of the stack."""
    num_layers: int
    """Decoder layers."""
    num_heads: int
    """Attention heads (as many key/value heads; head_dim = hidden_size / num_heads)."""
    intermediate_size: int
    """SwiGLU width."""
    rms_norm_eps: float
    """RMSNorm epsilon (the LM's)."""
    rope_theta: float
    """RoPE base (the LM's)."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"local_attn_heads: {self.num_heads} heads do not divide width {self.hidden_size}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def local_config(config: Any) -> LocalConfig:
    """The local (output) transformer's config."""
    return LocalConfig(
        config.local_dim,
        config.local_layers,
        config.local_attn_heads,
        config.local_ffn_dim,
        config.rms_norm_eps,
        rope_theta(config),
    )


def input_local_config(config: Any) -> LocalConfig:
    """The input local transformer's (the patch encoder's) config."""
    width = config.input_local_dim or config.local_dim
    return LocalConfig(
        width,
        config.input_local_layers,
        config.local_attn_heads,
        4 * width,
        config.rms_norm_eps,
        rope_theta(config),
    )


@dataclass(frozen=True)
class AudioDecoderConfig:
    """The audio tokenizer's decoder (the code2wav stage)."""

    d_model: int = 768
    """Width of the quantizer's codebooks and the decoder transformer."""
    avg_pooler: int = 1
    """Frames per code (the first transposed convolution's stride; 1: none)."""
    decoder_layers: int = 8
    """Decoder transformer layers."""
    decoder_attention_heads: int = 12
    """Heads of the decoder transformer."""
    decoder_ffn_dim: int = 3072
    """Feed-forward width of the decoder transformer."""
    stride_size: int = 2
    """The encoder's stride: the reference's `streaming_decode` counts a code's samples as
    `avg_pooler * stride_size * hop_length` (`streaming.py`)."""
    decoder_kernel_size: int = 3
    """Kernel of the transposed convolution to mel frames."""
    decoder_stride_size: int = 2
    """Stride of the transposed convolution to mel frames."""
    decoder_causal: bool = True
    """Whether the decoder transformer attends causally."""
    decoder_attn_window_size: tuple[int, int] = (-1, -1)
    """(left, right) attention window of the decoder (-1: unbounded)."""
    nfft: int = 1024
    """FFT size of the vocoder's ISTFT head (also its window)."""
    vocoder_dim: int = 512
    """Width of the vocoder transformer."""
    vocoder_intermediate_dim: int = 4096
    """Feed-forward width of the vocoder."""
    vocoder_num_layers: int = 30
    """Vocoder transformer layers."""
    vocoder_attention_heads: int = 4
    """Heads of the vocoder transformer."""
    vocoder_attn_window_size: tuple[int, int] = (40, 10)
    """(left, right) attention window of the vocoder."""
    vocoder_padding: str = "same"
    """ISTFT padding: "same" or "center"."""
    n_mels: int = 80
    """Mel bins between the decoder and the vocoder."""
    sampling_rate: int = 24000
    """Output sample rate."""
    hop_length: int = 240
    """Samples per mel frame."""
    num_quantizers: int = 12
    """Codebooks of the residual quantizer (the LM uses the first `audio_channels`)."""
    codebook_size: tuple[int, ...] = (1024,)
    """Codes per codebook (the last repeats for the rest)."""
    rope_theta: float = 10000.0
    """RoPE base of both transformers."""
    rope_type: str = "default"
    """Only "default" is served."""
    ln_type: str = "LayerNorm"
    """"LayerNorm" or "RMSNorm"."""
    activation_function: str = "gelu"
    """Feed-forward activation (a transformers `ACT2FN` name)."""

    def __post_init__(self) -> None:
        if self.rope_type != "default":
            raise ValueError(f"rope_type: {self.rope_type!r} is not served (only 'default')")
        if self.ln_type not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"ln_type: {self.ln_type!r} is neither LayerNorm nor RMSNorm")
        if self.vocoder_padding not in ("same", "center"):
            raise ValueError(f"vocoder_padding: {self.vocoder_padding!r} is not same or center")
        for name in ("d_model", "vocoder_dim"):
            heads = "decoder_attention_heads" if name == "d_model" else "vocoder_attention_heads"
            if getattr(self, name) % getattr(self, heads):
                raise ValueError(f"{heads}: does not divide {name} {getattr(self, name)}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AudioDecoderConfig:
        """The fields of a tokenizer `config.json` (others ignored; None keeps a default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in names and v is not None}
        for key in ("decoder_attn_window_size", "vocoder_attn_window_size", "codebook_size"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    @property
    def codebook_sizes(self) -> list[int]:
        sizes = list(self.codebook_size)
        return sizes + [sizes[-1]] * (self.num_quantizers - len(sizes))

    @property
    def samples_per_code(self) -> int:
        """Output samples per code frame."""
        return self.avg_pooler * self.decoder_stride_size * self.hop_length


@dataclass(frozen=True)
class AudioEncoderConfig:
    """The audio tokenizer's encoder and its log-mel front end (the fields of the
    tokenizer's `config.json` that `AudioEncoder` and `wav2mel` read)."""

    n_mels: int = 128
    """Mel bins of the input features."""
    d_model: int = 1280
    """Width of the encoder and the quantizer's codebooks."""
    kernel_size: int = 3
    """Kernel of both input convolutions."""
    stride_size: int = 2
    """Stride of the second input convolution."""
    avg_pooler: int = 4
    """Frames pooled into one code (a strided convolution; 1: none)."""
    encoder_layers: int = 32
    """Encoder transformer layers."""
    encoder_attention_heads: int = 20
    """Heads of the encoder transformer."""
    encoder_ffn_dim: int = 5120
    """Feed-forward width of the encoder."""
    encoder_causal: bool = False
    """Whether the encoder attends causally."""
    encoder_attn_window_size: tuple[int, int] = (-1, -1)
    """(left, right) attention window of the encoder (-1: unbounded)."""
    encoder_skip_layer_id: int | None = None
    """1-based layer whose output is added to the last layer's (None: no skip)."""
    num_quantizers: int = 12
    """Codebooks of the residual quantizer."""
    codebook_size: tuple[int, ...] = (1024,)
    """Codes per codebook (the last repeats for the rest)."""
    rope_theta: float = 10000.0
    """RoPE base of the encoder."""
    ln_type: str = "LayerNorm"
    """"LayerNorm" or "RMSNorm"."""
    activation_function: str = "gelu"
    """Feed-forward activation (a transformers `ACT2FN` name)."""
    sampling_rate: int = 24000
    """Sample rate the clip is resampled to."""
    nfft: int = 1024
    """FFT size of the mel spectrogram."""
    hop_length: int = 240
    """Samples per mel frame."""
    window_size: int = 1024
    """Hann window length of the mel spectrogram."""
    fmin: float = 0.0
    """Lowest mel filter frequency."""
    fmax: float | None = None
    """Highest mel filter frequency (None: half the sample rate)."""

    def __post_init__(self) -> None:
        if self.ln_type not in ("LayerNorm", "RMSNorm"):
            raise ValueError(f"ln_type: {self.ln_type!r} is neither LayerNorm nor RMSNorm")
        if self.d_model % self.encoder_attention_heads:
            raise ValueError(f"encoder_attention_heads: does not divide d_model {self.d_model}")

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> AudioEncoderConfig:
        """The fields of a tokenizer `config.json` (others ignored; None keeps a default,
        except `encoder_skip_layer_id` and `fmax`, whose None means none)."""
        names = {f.name for f in dataclasses.fields(cls)}
        optional = ("encoder_skip_layer_id", "fmax")
        kwargs = {k: v for k, v in raw.items() if k in names and (v is not None or k in optional)}
        for key in ("encoder_attn_window_size", "codebook_size"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return cls(**kwargs)

    @property
    def codebook_sizes(self) -> list[int]:
        sizes = list(self.codebook_size)
        return sizes + [sizes[-1]] * (self.num_quantizers - len(sizes))
