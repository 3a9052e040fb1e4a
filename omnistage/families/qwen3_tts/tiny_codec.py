"""A tiny random-weight Qwen3-TTS 12 Hz speech tokenizer (`speech_tokenizer/` of a checkpoint).

Written with the Hub's layout and keys: `config.json` (model_type
`qwen3_tts_tokenizer_12hz`, a Mimi `encoder_config`, a `decoder_config`, the sample
rates and the 48-samples-per-frame encode / decode rates of this tiny one),
`preprocessor_config.json` (the `EncodecFeatureExtractor` the reference loader reads)
and `model.safetensors` with seeded weights under the reference's names: `decoder.*`
(`Qwen3TTSCodecDecoder`, whose names are the reference's) and `encoder.*` (a
transformers `MimiModel` without its decoder side, under the transformers 4.x names the
released checkpoint and the reference use). This module owns that tiny config and the
weight draw; the reference-parity fixture (`tests/fixtures/qwen3_tts/`) decodes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import safetensors.torch
import torch

from omnistage.families.qwen3_tts.codec_decoder import CodecDecoderConfig, Qwen3TTSCodecDecoder

TINY_CODEBOOK_SIZE = 64
TINY_NUM_QUANTIZERS = 16
TINY_SAMPLES_PER_FRAME = 48  # decoder: 4 * 3 * 2 * 2; encoder: 4 * 3 * 2, then stride 2
SAMPLE_RATE = 24000

DECODER_CONFIG: dict[str, object] = {
    "attention_bias": False,
    "codebook_dim": 16,
    "codebook_size": TINY_CODEBOOK_SIZE,
    "decoder_dim": 32,
    "head_dim": 16,  # != hidden_size / heads, as in the released model (512 / 16 vs 64)
    "hidden_act": "silu",
    "hidden_size": 32,
    "intermediate_size": 64,
    "latent_dim": 24,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_quantizers": TINY_NUM_QUANTIZERS,
    "num_semantic_quantizers": 1,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "semantic_codebook_size": 2 * TINY_CODEBOOK_SIZE,
    "sliding_window": 8,
    "upsample_rates": [4, 3],
    "upsampling_ratios": [2, 2],
    "vector_quantization_hidden_dimension": 16,
}

ENCODER_CONFIG: dict[str, object] = {
    "model_type": "mimi",
    "_frame_rate": SAMPLE_RATE / TINY_SAMPLES_PER_FRAME,
    "sampling_rate": SAMPLE_RATE,
    "audio_channels": 1,
    "hidden_size": 32,
    "num_filters": 4,
    "num_residual_layers": 1,
    "upsampling_ratios": [4, 3, 2],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": TINY_CODEBOOK_SIZE,
    "codebook_dim": 16,
    "num_quantizers": 2 * TINY_NUM_QUANTIZERS,
    "num_semantic_quantizers": 1,
    "vector_quantization_hidden_dimension": 16,
    "use_conv_shortcut": False,
    "upsample_groups": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 8,
    "hidden_act": "gelu",
    "max_position_embeddings": 8000,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "sliding_window": 250,
    "attention_dropout": 0.0,
    "layer_scale_initial_scale": 0.01,
    "attention_bias": False,
    "use_cache": False,
    "use_streaming": False,
}

PREPROCESSOR_CONFIG: dict[str, object] = {
    "chunk_length_s": None,
    "feature_extractor_type": "EncodecFeatureExtractor",
    "feature_size": 1,
    "overlap": None,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": True,
    "sampling_rate": SAMPLE_RATE,
}

# transformers 5 nests Mimi's encoder side; the checkpoint keeps the 4.x names.
_MIMI_V4_NAMES = {
    "encoder.encoder_seanet.": "encoder.",
    "encoder.encoder_transformer.": "encoder_transformer.",
    "encoder.downsample.": "downsample.",
}
_MIMI_DECODER_SIDE = ("upsample.", "decoder_transformer.", "decoder.")


def tiny_speech_tokenizer_config() -> dict[str, object]:
    """The `speech_tokenizer/config.json` of the tiny model."""
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_config": ENCODER_CONFIG,
        "decoder_config": DECODER_CONFIG,
        "encoder_valid_num_quantizers": TINY_NUM_QUANTIZERS,
        "input_sample_rate": SAMPLE_RATE,
        "output_sample_rate": SAMPLE_RATE,
        "decode_upsample_rate": TINY_SAMPLES_PER_FRAME,
        "encode_downsample_rate": TINY_SAMPLES_PER_FRAME,
    }


def _mimi_encoder_shapes() -> Iterator[tuple[str, torch.Size]]:
    """Names (4.x layout, without the `encoder.` prefix) and shapes of Mimi's encoder side."""
    from transformers import MimiConfig, MimiModel

    with torch.device("meta"):
        mimi = MimiModel(MimiConfig(**ENCODER_CONFIG))
    for name, tensor in mimi.state_dict().items():
        for new, old in _MIMI_V4_NAMES.items():
            if name.startswith(new):
                name = old + name[len(new) :]
                break
        else:
            if name.startswith(_MIMI_DECODER_SIDE):
                continue
        yield name, tensor.shape


def _draw(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """One seeded tensor: codebooks O(1) (usage in [0.5, 1.5)), norm weights N(1, 0.1),
    matrices N(0, min(0.2, fan_in**-0.5)) so activations stay O(1), other vectors N(0, 0.1)."""
    if name.endswith("initialized"):  # Mimi's codebook flag
        return torch.ones(shape)
    if name.endswith("cluster_usage"):
        return 0.5 + torch.rand(shape, generator=generator)
    if name.endswith(("embed_sum", "embedding_sum")):
        return torch.randn(shape, generator=generator)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=generator)
    if len(shape) >= 2:
        std = min(0.2, shape[1:].numel() ** -0.5)
        return std * torch.randn(shape, generator=generator)
    return 0.1 * torch.randn(shape, generator=generator)


def tiny_speech_tokenizer_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """The seeded float32 weights, `decoder.*` then `encoder.*`.

    The decoder's last convolution is scaled by 0.1 so the waveform mostly stays inside
    the final clamp to [-1, 1] (a clipped signal would hide differences in parity tests).
    """
    generator = torch.Generator().manual_seed(seed)
    decoder = Qwen3TTSCodecDecoder(CodecDecoderConfig.from_dict(DECODER_CONFIG))
    last = f"decoder.{len(decoder.decoder) - 1}."
    weights = {}
    for name, tensor in decoder.state_dict().items():
        values = _draw(name, tensor.shape, generator)
        weights[f"decoder.{name}"] = values * 0.1 if name.startswith(last) else values
    for name, shape in _mimi_encoder_shapes():
        weights[f"encoder.{name}"] = _draw(name, shape, generator)
    return weights


def write_tiny_speech_tokenizer(directory: Path, seed: int = 0, dtype=torch.float32) -> Path:
    """Write `directory/speech_tokenizer/` (config, preprocessor config, seeded weights);
    return that folder. Weights are drawn in float32 whatever `dtype` is."""
    folder = Path(directory) / "speech_tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_speech_tokenizer_config()
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
    weights = {k: v.to(dtype).contiguous() for k, v in tiny_speech_tokenizer_weights(seed).items()}
    safetensors.torch.save_file(weights, str(folder / "model.safetensors"), {"format": "pt"})
    return folder
