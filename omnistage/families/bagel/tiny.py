"""A tiny random-weight Bagel checkpoint, in Bagel's own layout (the built-in `demo-bagel`).

Writes into one folder what BAGEL-7B-MoT ships, at toy sizes:

- `llm_config.json`: a Qwen2 config with Bagel's extra fields (`qk_norm`,
  `layer_module: Qwen2MoTDecoderLayer`), 2 layers, width 32, 4 query heads over 2
  key/value heads (grouped attention exercised);
- `vit_config.json`: a 2-layer SigLIP vision config (Bagel drops its last layer);
- `ema.safetensors`: every weight under Bagel's names — both experts of every layer,
  `time_embedder`, `vae2llm`, `llm2vae`, `latent_pos_embed` (the fixed 2-D sin-cos
  table, as Bagel builds it), the ViT (`vit_model.vision_model.…`, one layer fewer than
  `vit_config.json` states, patch embedding as the linear layer Bagel converts it to),
  `connector`, `vit_pos_embed`;
- `ae.safetensors`: a FLUX autoencoder in FLUX's names (2 levels: 2 pixels per latent;
  4 latent channels), with `ae_config.json` stating its sizes;
- `bagel_config.json`: latent patch 2, an 8 x 8 grid of latent patches (images up to
  32 x 32 pixels), an 8 x 8 grid of ViT patches of 4 pixels, and the input-image
  bounds (`vae_image_sizes`, `vit_image_sizes`: longest and shortest side);
- a byte-level tokenizer with Bagel's four special tokens.

Everything is drawn from one seeded generator: the same seed writes the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from omnistage.families.bagel.config import (
    AE_CONFIG,
    AE_WEIGHTS,
    BAGEL_CONFIG,
    LLM_CONFIG,
    SPECIAL_TOKENS,
    VIT_CONFIG,
    WEIGHTS,
    AutoEncoderParams,
    BagelConfig,
)
from omnistage.models.tiny_checkpoints import byte_tokenizer

LLM = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 272,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "qk_norm": True,
    "layer_module": "Qwen2MoTDecoderLayer",
}
VIT = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": 32,
    "patch_size": 4,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
AE = {"resolution": 32, "downsample": 2, "ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1}
AE |= {"z_channels": 4, "scale_factor": 0.3611, "shift_factor": 0.1159}
BAGEL = {"latent_patch_size": 2, "max_latent_size": 8, "vit_max_num_patch_per_side": 8}
BAGEL |= {"connector_act": "gelu_pytorch_tanh", "timestep_shift": 3.0}
BAGEL |= {"vae_image_sizes": [32, 16], "vit_image_sizes": [32, 16]}
WEIGHT_STD = 0.15


def sincos_table(side: int, dim: int) -> torch.Tensor:
    """Bagel's `PositionEmbedding` table: 2-D sin-cos over a `side` x `side` grid (MAE's
    `get_2d_sincos_pos_embed`: half the width for rows, half for columns)."""

    def one_axis(d: int, pos: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid = np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32))
    table = np.concatenate([one_axis(dim // 2, grid[0]), one_axis(dim // 2, grid[1])], axis=1)
    return torch.from_numpy(table).float()


def _randomize(names_shapes: dict[str, tuple[int, ...]], generator: torch.Generator) -> dict:
    out = {}
    for name in sorted(names_shapes):
        shape = names_shapes[name]
        draw = torch.randn(shape, generator=generator, dtype=torch.float64)
        is_norm = "norm" in name and name.endswith("weight") and len(shape) == 1
        out[name] = (1.0 + 0.1 * draw if is_norm else WEIGHT_STD * draw).float()
    return out


def _llm_and_heads(config: BagelConfig, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from omnistage.families.bagel.generator import BagelGenerator

    model = BagelGenerator(config, torch.float32)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes.pop("latent_pos_embed.pos_embed")
    weights = _randomize(shapes, generator)
    weights["latent_pos_embed.pos_embed"] = sincos_table(config.max_latent_size, config.hidden_size)
    return weights


def _vit_and_connector(hidden: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from transformers import SiglipVisionConfig

    from omnistage.families.bagel.vision import BagelVision

    side, act = BAGEL["vit_max_num_patch_per_side"], BAGEL["connector_act"]
    model = BagelVision(SiglipVisionConfig(**VIT), hidden, side, act, torch.float32)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes.pop("vit_pos_embed.pos_embed")
    weights = _randomize(shapes, generator)
    weights["vit_pos_embed.pos_embed"] = sincos_table(side, hidden)
    return weights


def _autoencoder(params: AutoEncoderParams, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from omnistage.families.bagel.autoencoder import AutoEncoder

    shapes = {k: tuple(v.shape) for k, v in AutoEncoder(params).state_dict().items()}
    return _randomize(shapes, generator)


def make_tiny_bagel(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint folder at `path`; returns it."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for name, content in (
        (LLM_CONFIG, LLM),
        (VIT_CONFIG, VIT),
        (AE_CONFIG, AE),
        (BAGEL_CONFIG, BAGEL),
    ):
        (path / name).write_text(json.dumps(content, indent=2) + "\n")
    config = BagelConfig.load(path)
    generator = torch.Generator().manual_seed(seed)
    weights = _llm_and_heads(config, generator) | _vit_and_connector(LLM["hidden_size"], generator)
    save_file(weights, str(path / WEIGHTS))
    save_file(_autoencoder(config.vae, generator), str(path / AE_WEIGHTS))
    tokenizer = byte_tokenizer(list(SPECIAL_TOKENS[2:]))
    tokenizer.save_pretrained(str(path))
    return path


def make_demo_bagel(path: str | Path, seed: int = 0) -> Path:
    """The built-in demo: the tiny checkpoint in `path/bagel`, its served view in `path`."""
    from omnistage.families.bagel.layout import convert

    path = Path(path)
    make_tiny_bagel(path / "bagel", seed)
    convert(path / "bagel", path)
    return path
