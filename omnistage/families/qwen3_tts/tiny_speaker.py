"""A tiny seeded speaker encoder for tests: its config and its `speaker_encoder.*` tensors.

The weights come from numpy's PCG64 (`np.random.default_rng(seed)`), filled in sorted
parameter-name order, so any environment with numpy reproduces them bit for bit (the
reference fixture script relies on it). The tiny whole-model checkpoint merges these
tensors into its `model.safetensors` and puts the config under `speaker_encoder_config`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.families.qwen3_tts.speaker_encoder import PREFIX, SpeakerEncoder


def tiny_speaker_encoder_config() -> dict[str, Any]:
    """The reference architecture at toy width (the mel front end is the real 128 bins)."""
    return {
        "mel_dim": 128,
        "enc_dim": 32,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_kernel_sizes": [5, 3, 3, 3, 1],
        "enc_dilations": [1, 2, 3, 4, 1],
        "enc_attention_channels": 8,
        "enc_res2net_scale": 4,
        "enc_se_channels": 8,
        "sample_rate": 24000,
    }


def random_speaker_encoder_state(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Seeded float32 weights, names prefixed `speaker_encoder.`: conv weights
    ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2)."""
    shapes = {name: tuple(t.shape) for name, t in SpeakerEncoder(config).state_dict().items()}
    rng = np.random.default_rng(seed)
    state: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 0
        std = 1.0 / np.sqrt(fan_in) if fan_in else 0.1
        values = rng.standard_normal(shape).astype(np.float32) * np.float32(std)
        state[PREFIX + name] = torch.from_numpy(values)
    return state
