"""The tiny checkpoint's talker: its `talker_config` and seeded weights (in
`talker.safetensors`, beside the thinker's `model.safetensors`) under the reference's
names with a `talker.` prefix (`talker.model.model.*`,
`talker.model.lm_head.weight`, `talker.stop_head.*`, `talker.spk_head.*`,
`talker.flowloss.cfm.model.*`, `talker.linear_proj_audio.*`, `talker.audio.decoder.*`).

Sizes: a 2-layer Qwen2 of width 24 (the tiny heads' `llm_hidden_size`), the tiny heads
(`talker_heads.TINY`: 8 latent channels, patches of 4 frames, 8 frames of history) and a
tiny audio VAE decoder (`audio_vae.TINY_VAE`). Weights N(0, 0.2) for matrices, N(1, 0.1)
for norms, N(0, 0.1) for vectors, as the thinker's.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from omnistage.families.ming_flash_omni.audio_vae import TINY_VAE, vae_weight_shapes
from omnistage.families.ming_flash_omni.talker_config import MingFlashTalkerConfig
from omnistage.families.ming_flash_omni.talker_heads import (
    AGGREGATOR_PREFIX,
    DIT_PREFIX,
    TINY,
)
from omnistage.models.tiny_checkpoints import VOCAB_SIZE

TALKER_LM = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=TINY.llm_hidden_size,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=1024,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
TALKER_WEIGHTS = "talker.safetensors"
STOP_LEAN = 1.0
SPECIALS = ["<audio>", "<|vision_start|>", "<|vision_pad|>", "<|vision_end|>"]
"""Tokens of the talker's prompt the tiny byte tokenizer adds (the real one has them)."""


def tiny_talker_config() -> MingFlashTalkerConfig:
    heads = asdict(TINY)
    heads.pop("llm_hidden_size")
    return MingFlashTalkerConfig(**TALKER_LM, **heads, audio_vae=dict(TINY_VAE))


def _value(name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    last = name.rsplit(".", 2)
    if "norm" in (last[-2] if len(last) > 1 else "") or name.endswith("norm.weight"):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    return (0.2 if len(shape) >= 2 else 0.1) * torch.randn(shape, generator=g)


def tiny_talker_weights(config: MingFlashTalkerConfig, seed: int) -> dict[str, Any]:
    """The talker's seeded weights, by their checkpoint names."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    g = torch.Generator().manual_seed(seed)
    lm = Qwen2ForCausalLM(Qwen2Config(**TALKER_LM))
    out = {}
    for name, p in lm.state_dict().items():
        out["talker.model." + name] = _value(name, tuple(p.shape), g)
    dit, agg = config.heads.build(torch.float32)
    for module, prefix in ((dit, DIT_PREFIX), (agg, AGGREGATOR_PREFIX)):
        for name, p in module.state_dict().items():
            out["talker." + prefix + name] = _value(name, tuple(p.shape), g)
    h = config.hidden_size
    for name, shape in {
        "stop_head.weight": (2, h),
        "stop_head.bias": (2,),
        "spk_head.weight": (h, 192),
        "spk_head.bias": (h,),
    }.items():
        out["talker." + name] = _value(name, shape, g)
    # Leaning to go on, so that requests stop at different steps (not all at the first
    # step allowed, as the drawn bias alone makes them).
    out["talker.stop_head.bias"] += torch.tensor([STOP_LEAN, -STOP_LEAN])
    for name, shape in vae_weight_shapes(config.audio_vae).items():
        out["talker.audio.decoder." + name] = _value(name, shape, g)
    return {k: v.contiguous() for k, v in out.items()}
