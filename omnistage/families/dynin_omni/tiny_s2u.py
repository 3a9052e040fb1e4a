"""A tiny random-weight EMOVA speech-to-unit encoder (S2U) for the tiny Dynin-Omni
checkpoints: `hparams.yaml` in the layout of EMOVA's S2U run (the keys `s2u` reads, with
EMOVA's front end: 16 kHz, 20 ms / 10 ms, but 16 mels) and `model.safetensors` in the
checkpoint's parameter names (`encoder.feature_encoder.*`, the positional convolutions'
weight norm as `weight_g`/`weight_v`, `pre_quant.*`, plus a `decoder.*` CTC weight that the
loader must skip). Two blocks as EMOVA's (strided convolutions 5/2, 5/2, 1/1 then a
transformer; 5/1, 1/1 then a transformer: 40 ms a unit); the first convolution's output
has an odd channel count so both of the reference's padding parities are exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

TINY_S2U_LEVELS = (4, 4, 2)
"""32 units, the tiny checkpoints' `audio_codebook_size`."""


def _conv(filters: int, kernel: int, stride: int, act: str | None) -> dict[str, Any]:
    return {
        "filters": filters,
        "kernel_size": [kernel],
        "stride": [stride],
        "norm_type": "ln",
        "gn_groups": None,
        "act_func": act,
        "dilation": [1],
        "dropout": 0.0,
        "padding": "same",
        "bias": True,
        "residual": False,
    }


def _transformer(layers: int, dim: int, heads: int) -> dict[str, Any]:
    return {
        "use_pytorch_transformer": False,
        "dropout": 0.1,
        "conv": {"conv_pos": 8, "conv_pos_groups": 2, "layer_drop": 0.0},
        "encoder": {
            "encoder_layers": layers,
            "encoder_layerdrop": 0.0,
            "embedding_dim": dim,
            "ffn_embedding_dim": 2 * dim,
            "num_attention_heads": heads,
            "dropout": 0.1,
            "attention_dropout": 0.1,
            "activation_dropout": 0.1,
            "activation_fn": "gelu",
            "layer_norm_first": True,
        },
    }


def tiny_s2u_hparams(levels: tuple[int, ...]) -> dict[str, Any]:
    pre = {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": 16000,
        "window_size": 0.02,
        "window_stride": 0.01,
        "window": "hann",
        "normalize": "per_feature",
        "n_fft": None,
        "preemph": 0.97,
        "features": 16,
        "lowfreq": 0,
        "highfreq": None,
        "log": True,
        "log_zero_guard_type": "add",
        "log_zero_guard_value": 2.0**-24,
        "dither": 1e-5,
        "dither_train_only": True,
        "pad_to": 16,
        "frame_splicing": 1,
        "stft_exact_pad": False,
        "stft_conv": False,
        "pad_value": 0,
        "mag_power": 2.0,
        "normalize_time_domain": True,
    }
    blocks = [
        {
            "conv_layers": [_conv(9, 5, 2, "relu"), _conv(12, 5, 2, "relu"), _conv(12, 1, 1, None)],
            "transformer_block": _transformer(1, 12, 2),
        },
        {
            "conv_layers": [_conv(24, 5, 1, "relu"), _conv(16, 1, 1, None)],
            "transformer_block": _transformer(2, 16, 4),
        },
    ]
    encoder = {
        "_target_": "nemo.collections.asr.parts.spec2vec.FeatureEncoder",
        "feat_in": 16,
        "use_conv_mask": True,
        "conv2d_block": None,
        "conv_transformer_blocks": blocks,
        "use_tf_pad": True,
        "ln_eps": 1e-5,
    }
    quantizer = {"levels": list(levels), "l2_norm": False, "batch_norm": False}
    return {
        "encoder_type": "st",
        "encoder": {"preprocessor": pre, "feature_encoder": encoder},
        "quantizer": quantizer,
    }


def make_tiny_s2u(folder: Path, levels: tuple[int, ...], generator: torch.Generator) -> None:
    """Write `hparams.yaml` and seeded random `model.safetensors` to `folder`."""
    from safetensors.torch import save_file

    from omnistage.families.dynin_omni.s2u import ENCODER_PREFIX, S2UConfig, SpeechToUnit

    folder.mkdir(parents=True, exist_ok=True)
    raw = tiny_s2u_hparams(levels)
    (folder / "hparams.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    model = SpeechToUnit(S2UConfig.from_hparams(raw))
    state: dict[str, torch.Tensor] = {}
    for name, p in model.state_dict().items():
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32)
        if "norm" in name and name.endswith("weight"):
            value = 1.0 + 0.1 * noise
        elif name.endswith("bias"):
            value = 0.1 * noise
        else:
            value = noise / max(1.0, float(p[0].numel()) ** 0.5)
        if name.startswith("feature_encoder.") and ".pos_conv.0.weight" in name:
            stem = ENCODER_PREFIX + name[len("feature_encoder.") :]
            state[stem + "_v"] = value
            g = value.norm(dim=(0, 1), keepdim=True) * (
                1.0 + 0.1 * torch.rand(1, 1, p.shape[2], generator=generator)
            )
            state[stem + "_g"] = g
        elif name.startswith("feature_encoder."):
            state[ENCODER_PREFIX + name[len("feature_encoder.") :]] = value
        else:
            state[name] = value
    state["decoder.decoder_layers.0.weight"] = torch.randn(5, 16, 1, generator=generator)
    save_file(state, str(folder / "model.safetensors"))
