"""Qwen3-TTS's `config.json` as transformers configs (`model_type` "qwen3_tts").

transformers does not know Qwen3-TTS; the official `qwen-tts` package declares
these configs, and we read the same keys with the same defaults
(`qwen_tts/core/models/configuration_qwen3_tts.py`, 0.1.1). The registry
registers `Qwen3TTSConfig` with `AutoConfig` before a checkpoint of this type is
read (`Family.configs`).

Rotary positions: the talker's `rope_scaling` names a multimodal section split,
but a TTS prompt is text only — its three position rows are equal — and then
multimodal RoPE is plain RoPE, so both decoders carry plain `rope_parameters`.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


def _plain_rope(config: PretrainedConfig, rope_theta: float) -> None:
    config.rope_theta = rope_theta
    config.rope_parameters = {"rope_type": "default", "rope_theta": rope_theta}


class Qwen3TTSSpeakerEncoderConfig(PretrainedConfig):
    model_type = "qwen3_tts_speaker_encoder"

    def __init__(
        self,
        mel_dim: int = 128,
        enc_dim: int = 1024,
        enc_channels: list[int] | None = None,
        enc_kernel_sizes: list[int] | None = None,
        enc_dilations: list[int] | None = None,
        enc_attention_channels: int = 128,
        enc_res2net_scale: int = 8,
        enc_se_channels: int = 128,
        sample_rate: int = 24000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mel_dim = mel_dim
        self.enc_dim = enc_dim
        self.enc_channels = enc_channels or [512, 512, 512, 512, 1536]
        self.enc_kernel_sizes = enc_kernel_sizes or [5, 3, 3, 3, 1]
        self.enc_dilations = enc_dilations or [1, 2, 3, 4, 1]
        self.enc_attention_channels = enc_attention_channels
        self.enc_res2net_scale = enc_res2net_scale
        self.enc_se_channels = enc_se_channels
        self.sample_rate = sample_rate


class Qwen3TTSCodePredictorConfig(PretrainedConfig):
    """The talker's code predictor: a small dense Qwen3 decoder writing codes 1..G-1."""

    model_type = "qwen3_tts_talker_code_predictor"

    def __init__(
        self,
        vocab_size: int = 2048,
        hidden_size: int = 1024,
        intermediate_size: int = 3072,
        num_hidden_layers: int = 5,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 8,
        head_dim: int = 128,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000,
        attention_bias: bool = False,
        num_code_groups: int = 32,
        **kwargs: Any,
    ) -> None:
        for key in ("rope_scaling", "rope_parameters", "tie_word_embeddings"):
            kwargs.pop(key, None)
        super().__init__(tie_word_embeddings=False, **kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.attention_bias = attention_bias
        self.num_code_groups = num_code_groups
        _plain_rope(self, rope_theta)


class Qwen3TTSTalkerConfig(PretrainedConfig):
    """The talker: a dense Qwen3 decoder over codebook 0, its text embedding and
    projection, and the codec control ids, speakers and languages."""

    model_type = "qwen3_tts_talker"
    sub_configs = {"code_predictor_config": Qwen3TTSCodePredictorConfig}

    def __init__(
        self,
        code_predictor_config: dict[str, Any] | Qwen3TTSCodePredictorConfig | None = None,
        vocab_size: int = 3072,
        hidden_size: int = 1024,
        intermediate_size: int = 2048,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 2,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000,
        attention_bias: bool = False,
        num_code_groups: int = 32,
        text_hidden_size: int = 2048,
        text_vocab_size: int = 151936,
        codec_eos_token_id: int = 4198,
        codec_think_id: int = 4202,
        codec_nothink_id: int = 4203,
        codec_think_bos_id: int = 4204,
        codec_think_eos_id: int = 4205,
        codec_pad_id: int = 4196,
        codec_bos_id: int = 4197,
        spk_id: dict[str, int] | None = None,
        spk_is_dialect: dict[str, Any] | None = None,
        codec_language_id: dict[str, int] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("rope_scaling", None)  # multimodal sections: plain RoPE here (see above)
        kwargs.pop("rope_parameters", None)
        kwargs.pop("tie_word_embeddings", None)
        super().__init__(tie_word_embeddings=False, **kwargs)
        if isinstance(code_predictor_config, Qwen3TTSCodePredictorConfig):
            self.code_predictor_config = code_predictor_config
        else:
            self.code_predictor_config = Qwen3TTSCodePredictorConfig(
                **(code_predictor_config or {})
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.attention_bias = attention_bias
        self.num_code_groups = num_code_groups
        self.text_hidden_size = text_hidden_size
        self.text_vocab_size = text_vocab_size
        self.codec_eos_token_id = codec_eos_token_id
        self.codec_think_id = codec_think_id
        self.codec_nothink_id = codec_nothink_id
        self.codec_think_bos_id = codec_think_bos_id
        self.codec_think_eos_id = codec_think_eos_id
        self.codec_pad_id = codec_pad_id
        self.codec_bos_id = codec_bos_id
        self.spk_id = dict(spk_id or {})
        self.spk_is_dialect = dict(spk_is_dialect or {})
        self.codec_language_id = dict(codec_language_id or {})
        _plain_rope(self, rope_theta)


class Qwen3TTSConfig(PretrainedConfig):
    """The whole checkpoint: talker (with its code predictor), speaker encoder (Base
    checkpoints), the model's kind and its text-side special ids."""

    model_type = "qwen3_tts"
    sub_configs = {
        "talker_config": Qwen3TTSTalkerConfig,
        "speaker_encoder_config": Qwen3TTSSpeakerEncoderConfig,
    }

    def __init__(
        self,
        talker_config: dict[str, Any] | Qwen3TTSTalkerConfig | None = None,
        speaker_encoder_config: dict[str, Any] | Qwen3TTSSpeakerEncoderConfig | None = None,
        tokenizer_type: str | None = None,
        tts_model_size: str | None = None,
        tts_model_type: str | None = None,
        im_start_token_id: int = 151644,
        im_end_token_id: int = 151645,
        tts_pad_token_id: int = 151671,
        tts_bos_token_id: int = 151672,
        tts_eos_token_id: int = 151673,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(talker_config, Qwen3TTSTalkerConfig):
            talker_config = Qwen3TTSTalkerConfig(**(talker_config or {}))
        if not isinstance(speaker_encoder_config, Qwen3TTSSpeakerEncoderConfig):
            speaker_encoder_config = Qwen3TTSSpeakerEncoderConfig(**(speaker_encoder_config or {}))
        self.talker_config = talker_config
        self.speaker_encoder_config = speaker_encoder_config
        self.tokenizer_type = tokenizer_type
        self.tts_model_size = tts_model_size
        self.tts_model_type = tts_model_type
        self.im_start_token_id = im_start_token_id
        self.im_end_token_id = im_end_token_id
        self.tts_pad_token_id = tts_pad_token_id
        self.tts_bos_token_id = tts_bos_token_id
        self.tts_eos_token_id = tts_eos_token_id
