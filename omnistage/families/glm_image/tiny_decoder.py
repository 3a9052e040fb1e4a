"""A tiny random-weight GLM-Image *decoder* checkpoint (the diffusion half of `GlmImagePipeline`).

Writes, in diffusers' layout and through each component's own `save_pretrained`:

- `transformer/`: a 2-layer `GlmImageTransformer2DModel` (patch 2, 4 latent channels) whose
  prior-token embedding has `prior_vocab_size` rows — it must cover every id the prior
  (the AR stage) can generate, as in the real model (codebook 16384);
- `vae/`: a 4-level `AutoencoderKL` (scale factor 8, so VAE x patch = 16: the prior's d32
  grid upsampled 2x lands exactly on the transformer's patches) with non-trivial
  `latents_mean` / `latents_std`;
- `text_encoder/` + `tokenizer/`: a tiny `T5EncoderModel` glyph encoder and a `ByT5Tokenizer`
  (byte level, needs no vocabulary file);
- `scheduler/`: a `FlowMatchEulerDiscreteScheduler` with dynamic shifting, so the
  pipeline's resolution-dependent `mu` changes the schedule;
- `model_index.json` for `GlmImagePipeline` listing every component, the prior's
  `vision_language_encoder` and `processor` included. Their directories are written by
  `omnistage.families.glm_image.tiny.save_tiny_glm_image_prior`, not here; an existing
  `model_index.json` (from that writer) is merged, not replaced.

A 128x128 image is 64 image tokens: a denoising step takes milliseconds on CPU.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

PRIOR_VOCAB_SIZE = 128
"""Default prior-token vocabulary (the tiny prior's `vision_vocab_size` should match it)."""
LATENT_CHANNELS = 4
TEXT_DIM = 32

MODEL_INDEX = {
    "_class_name": "GlmImagePipeline",
    "tokenizer": ["transformers", "ByT5Tokenizer"],
    "text_encoder": ["transformers", "T5EncoderModel"],
    "transformer": ["diffusers", "GlmImageTransformer2DModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
}
PRIOR_COMPONENTS = {
    "processor": ["transformers", "GlmImageProcessor"],
    "vision_language_encoder": ["transformers", "GlmImageForConditionalGeneration"],
}


def save_tiny_glm_image_decoder(
    path: str | Path,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    prior_vocab_size: int = PRIOR_VOCAB_SIZE,
) -> Path:
    """Write the decoder components of a tiny GLM-Image checkpoint under `path`; returns it."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from transformers import ByT5Tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)

    tokenizer = ByT5Tokenizer()
    tokenizer.save_pretrained(path / "tokenizer")
    # Each component draws from its own seed, so changing one leaves the others' weights.
    _save_glyph_encoder(path / "text_encoder", tokenizer, dtype, seed)
    _save_transformer(path / "transformer", dtype, seed + 1, prior_vocab_size)
    _save_vae(path / "vae", dtype, seed + 2)
    FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.25, max_shift=0.75, base_image_seq_len=256
    ).save_pretrained(path / "scheduler")
    _write_model_index(path / "model_index.json")
    return path


def _save_glyph_encoder(path: Path, tokenizer: Any, dtype: torch.dtype, seed: int) -> None:
    """A 2-layer `T5EncoderModel` over the ByT5 tokenizer's vocabulary."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(seed)
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=TEXT_DIM,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu",
            dropout_rate=0.0,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            is_encoder_decoder=False,
            use_cache=False,
        )
    )
    text_encoder.to(dtype).save_pretrained(path)


def _save_transformer(path: Path, dtype: torch.dtype, seed: int, prior_vocab_size: int) -> None:
    """A 2-layer `GlmImageTransformer2DModel` (patch 2) embedding `prior_vocab_size` ids."""
    from diffusers import GlmImageTransformer2DModel

    torch.manual_seed(seed)
    transformer = GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=LATENT_CHANNELS,
        out_channels=LATENT_CHANNELS,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        text_embed_dim=TEXT_DIM,
        time_embed_dim=16,
        condition_dim=8,
        prior_vq_quantizer_codebook_size=prior_vocab_size,
    )
    transformer.to(dtype).save_pretrained(path)


def _save_vae(path: Path, dtype: torch.dtype, seed: int) -> None:
    """A 4-level `AutoencoderKL` (scale 8) with seeded, non-trivial latent statistics."""
    from diffusers import AutoencoderKL

    torch.manual_seed(seed)
    stats = torch.rand(2, LATENT_CHANNELS, dtype=torch.float64)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=LATENT_CHANNELS,
        norm_num_groups=4,
        sample_size=128,
        latents_mean=[round(v, 4) for v in (stats[0] - 0.5).tolist()],
        latents_std=[round(v, 4) for v in (stats[1] + 0.5).tolist()],
    )
    vae.to(dtype).save_pretrained(path)


def _write_model_index(index_path: Path) -> None:
    """`model_index.json`, merged into one the prior's writer may have left."""
    import diffusers

    index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    index.update(MODEL_INDEX, _diffusers_version=diffusers.__version__)
    for name, entry in PRIOR_COMPONENTS.items():
        index.setdefault(name, entry)
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
