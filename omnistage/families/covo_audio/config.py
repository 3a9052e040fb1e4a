"""Covo-Audio's two configs: the checkpoint's `config.json` (`model_type` "covo_audio") as a
transformers config, and its vocoder's `token2wav/config.json` as a frozen dataclass.

transformers does not know Covo-Audio; Tencent's `covoaudio/configuration_covo_audio.py`
declares the config, and we read the same keys: `llm_config` (a Qwen2 decoder: the
fused thinker + talker, whose vocabulary is the text tokenizer's followed by the
speech codes), `encoder_config` (Whisper, audio in), `audio_token_index` (the id of
speech code 0: every id from there on is a code) and `adapter_downsample`.

`token2wav/config.json` is the reference's `Token2WavDecoder` config (`token2wav/config.json`
in Tencent/Covo-Audio): `model.token2latent` (a flow-matching DiT from speech codes to VAE
latents) and `model.wavegan` (BigVGAN from latents to a waveform), `inference` (the ODE
steps and the guidance weight), `data.audio.sample_rate`. The released checkpoint's
`token2wav/` holds only `model.pt` and `global_mean_var.npy` (the reference reads the
config from its repository): without a `config.json` there, `RELEASED_TOKEN2WAV` (that
file's values) is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig, Qwen2Config, WhisperConfig


class CovoAudioConfig(PretrainedConfig):
    model_type = "covo_audio"
    sub_configs = {"llm_config": Qwen2Config, "encoder_config": WhisperConfig}

    def __init__(
        self,
        llm_config: dict | Qwen2Config | None = None,
        encoder_config: dict | WhisperConfig | None = None,
        audio_token_index: int = 151671,
        adapter_downsample: int = 8,
        **kwargs: Any,
    ) -> None:
        if isinstance(llm_config, dict):
            llm_config = Qwen2Config(**llm_config)
        if isinstance(encoder_config, dict):
            encoder_config = WhisperConfig(**encoder_config)
        self.llm_config = llm_config if llm_config is not None else Qwen2Config()
        self.encoder_config = encoder_config if encoder_config is not None else WhisperConfig()
        self.audio_token_index = audio_token_index
        """The LM's id of speech code 0 (the text tokenizer's length)."""
        self.adapter_downsample = adapter_downsample
        self.whisper_feats_dim = self.encoder_config.d_model
        kwargs.pop("_llm_config_type", None)
        kwargs.pop("_encoder_config_type", None)
        super().__init__(**kwargs)


RELEASED_TOKEN2WAV: dict[str, Any] = {
    "data": {"audio": {"sample_rate": 24000, "hop_size": 480}},
    "model": {
        "type": "Token2WavDecoder",
        "token2latent": {
            "upsample_factor": 4, "token_vocab_size": 16384, "token_input_dim": 512,
            "z_dim": 64, "spkr_embed_dim": 1024,
            "transformer": {
                "num_layers": 12, "hidden_size": 1024, "ffn_hidden_size": 4096,
                "num_heads": 16, "modulation": True, "alibi_bias": False,
                "rotary_bias": True, "qk_norm": False,
            },
        },
        "wavegan": {
            "upsample_rates": [5, 3, 2, 2, 2, 2], "upsample_kernel_sizes": [10, 6, 4, 4, 4, 4],
            "upsample_initial_channel": 1536, "resblock": "1",
            "resblock_kernel_sizes": [3, 7, 11],
            "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
            "activation": "snakebeta", "snake_logscale": True, "latent_dim": 64,
        },
    },
    "inference": {"s_steps": 10, "cfg_alpha": 1.0, "dynamic_thr": False, "rescale_logits": False},
}  # fmt: skip
"""`token2wav/config.json` of github.com/Tencent/Covo-Audio (the keys read here)."""


@dataclass(frozen=True)
class DitConfig:
    """`model.token2latent`: the speech codes -> latents flow-matching transformer."""

    token_vocab_size: int
    """Speech codes (16384 in the real model)."""
    token_input_dim: int
    """Width of the code embedding."""
    z_dim: int
    """Width of one latent frame."""
    spkr_embed_dim: int
    """Width of the speaker embedding."""
    upsample_factor: int
    """Latent frames per speech code."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int

    def __post_init__(self) -> None:
        for name in ("token_vocab_size", "token_input_dim", "z_dim", "num_layers", "num_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"token2latent.{name}: must be positive")
        if self.upsample_factor < 2:
            raise ValueError("token2latent.upsample_factor: must be at least 2")
        if self.hidden_size % self.num_heads or self.hidden_size % 16:
            raise ValueError(
                "token2latent.transformer.hidden_size: must divide by num_heads and by 16 "
                "(the positional convolution's groups)"
            )


@dataclass(frozen=True)
class VocoderConfig:
    """`model.wavegan`: BigVGAN (causal, snake-beta activations) from latents to audio."""

    latent_dim: int
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    upsample_initial_channel: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    snake_logscale: bool

    def __post_init__(self) -> None:
        for u, k in zip(self.upsample_rates, self.upsample_kernel_sizes, strict=True):
            if k != 2 * u:
                raise ValueError("wavegan.upsample_kernel_sizes: a causal upsampler needs 2 x rate")
        if any(len(d) != 3 for d in self.resblock_dilation_sizes):
            raise ValueError("wavegan.resblock_dilation_sizes: resblock 1 takes 3 dilations each")
        if self.upsample_initial_channel % 2 ** len(self.upsample_rates):
            raise ValueError("wavegan.upsample_initial_channel: must halve at every upsampler")

    @property
    def hop(self) -> int:
        """Samples per latent frame."""
        hop = 1
        for rate in self.upsample_rates:
            hop *= rate
        return hop


@dataclass(frozen=True)
class Token2WavConfig:
    dit: DitConfig
    vocoder: VocoderConfig
    sample_rate: int
    steps: int
    """Points of the ODE's time grid (the midpoint solver takes `steps - 1` steps)."""
    cfg_alpha: float

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Token2WavConfig:
        """From `token2wav/config.json` (TypeError / KeyError / ValueError on a bad file)."""
        model = raw["model"]
        t2l, t = model["token2latent"], model["token2latent"]["transformer"]
        w = model["wavegan"]
        if model.get("type", "Token2WavDecoder") != "Token2WavDecoder":
            raise ValueError(f"model.type: {model['type']!r} is not Token2WavDecoder")
        if w.get("activation") != "snakebeta" or str(w.get("resblock")) != "1":
            raise ValueError("model.wavegan: only snakebeta activations with resblock 1 are run")
        if t.get("alibi_bias") or t.get("qk_norm") or not t.get("rotary_bias", False):
            raise ValueError("model.token2latent.transformer: only rotary attention is run")
        if not t.get("modulation", False):
            raise ValueError("model.token2latent.transformer.modulation: must be true")
        inference = raw.get("inference", {})
        if inference.get("rescale_logits") or inference.get("dynamic_thr"):
            raise ValueError("inference: rescale_logits / dynamic_thr are not run")
        dit = DitConfig(
            token_vocab_size=int(t2l["token_vocab_size"]),
            token_input_dim=int(t2l.get("token_input_dim", t["hidden_size"])),
            z_dim=int(t2l["z_dim"]),
            spkr_embed_dim=int(t2l.get("spkr_embed_dim", 512)),
            upsample_factor=int(t2l["upsample_factor"]),
            num_layers=int(t["num_layers"]),
            hidden_size=int(t["hidden_size"]),
            ffn_hidden_size=int(t.get("ffn_hidden_size", 4096)),
            num_heads=int(t.get("num_heads", 8)),
        )
        vocoder = VocoderConfig(
            latent_dim=int(w["latent_dim"]),
            upsample_rates=tuple(w["upsample_rates"]),
            upsample_kernel_sizes=tuple(w["upsample_kernel_sizes"]),
            upsample_initial_channel=int(w["upsample_initial_channel"]),
            resblock_kernel_sizes=tuple(w["resblock_kernel_sizes"]),
            resblock_dilation_sizes=tuple(tuple(d) for d in w["resblock_dilation_sizes"]),
            snake_logscale=bool(w.get("snake_logscale", False)),
        )
        if vocoder.latent_dim != dit.z_dim:
            raise ValueError("model.wavegan.latent_dim: must equal token2latent.z_dim")
        return cls(
            dit=dit,
            vocoder=vocoder,
            sample_rate=int(raw.get("data", {}).get("audio", {}).get("sample_rate", 24000)),
            steps=int(inference.get("s_steps", 10)),
            cfg_alpha=float(inference.get("cfg_alpha", 2.0)),
        )
