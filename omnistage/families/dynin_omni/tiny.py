"""Tiny random-weight Dynin-Omni checkpoints (tests, the built-in `demo-dynin-omni`).

The layout omnistage serves: the LLaDA model's `config.json` (LLaDA's and Dynin's field
names, `model_type: dynin_omni`), its `model.safetensors` in LLaDA's parameter names, a
byte-level tokenizer with Dynin's special tokens, and the MAGVITv2 image decoder in
`vq_model_image/` (its `config.json` states the tiny sizes; weights in MAGVITv2's names).
Vocabulary: the tokenizer's ids, then the image codes, then the speech units.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.families.dynin_omni.config import (
    MODEL_TYPE,
    SPECIAL_TOKENS,
    VQ_IMAGE_DIR,
    DyninOmniConfig,
)
from omnistage.models.tiny_checkpoints import byte_tokenizer

TINY_MAGVIT = {
    "ch": 32,
    "ch_mult": [1, 1],
    "num_res_blocks": [1, 1],
    "z_channels": 6,
    "resolution": 8,
}
"""A 4x4 grid of 6-bit codes -> 8x8 pixels."""


def tiny_config(tokenizer_len: int, mask_id: int, eos_id: int) -> dict:
    codebook, audio = 2 ** TINY_MAGVIT["z_channels"], 32
    vocab = tokenizer_len + codebook + audio
    return {
        "architectures": ["DyninOmniModelLM"],
        "model_type": MODEL_TYPE,
        "d_model": 32,
        "n_heads": 4,
        "n_kv_heads": 2,
        "n_layers": 2,
        "mlp_hidden_size": 64,
        "vocab_size": vocab,
        "embedding_size": (vocab + 127) // 128 * 128,
        "llm_vocab_size": tokenizer_len,
        "codebook_size": codebook,
        "audio_codebook_size": audio,
        "num_vq_tokens": 16,
        "mask_token_id": mask_id,
        "eos_token_id": eos_id,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "max_sequence_length": 512,
        "weight_tying": False,
        "block_type": "llama",
        "activation_type": "silu",
        "layer_norm_type": "rms",
        "rope": True,
        "text_max_new_tokens": 8,
        "text_steps": 4,
        "text_block_length": 4,
        "image_steps": 4,
        "image_temperature": 1.0,
        "audio_max_new_tokens": 8,
        "audio_steps": 4,
        "audio_block_length": 4,
    }


def _randomize(module: torch.nn.Module, generator: torch.Generator, std: float) -> dict:
    state = {}
    for name, p in module.state_dict().items():
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32) * std
        state[name] = (
            (1.0 + noise)
            if name.endswith(
                ("norm.weight", "norm1.weight", "norm2.weight", "norm_out.weight", "ln_f.weight")
            )
            else noise
        )
    return state


def make_tiny_dynin_omni(path: str | Path, seed: int = 0) -> Path:
    """Write a seeded tiny Dynin-Omni checkpoint to `path` (float32)."""
    from safetensors.torch import save_file

    from omnistage.families.dynin_omni.llada import LLaDAModelLM
    from omnistage.families.dynin_omni.magvit import MagvitConfig, VQGANDecoder

    path = Path(path)
    (path / VQ_IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer(list(SPECIAL_TOKENS))
    tokenizer.save_pretrained(str(path))
    config = tiny_config(
        len(tokenizer), tokenizer.convert_tokens_to_ids("<|mdm_mask|>"), tokenizer.eos_token_id
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed)
    lm = LLaDAModelLM(DyninOmniConfig.from_dict(config), torch.float32)
    save_file(_randomize(lm, generator, 0.3), str(path / "model.safetensors"))
    decoder = VQGANDecoder(MagvitConfig.from_dict(TINY_MAGVIT), torch.float32)
    weights = {f"decoder.{k}": v for k, v in _randomize(decoder, generator, 0.2).items()}
    (path / VQ_IMAGE_DIR / "config.json").write_text(json.dumps(TINY_MAGVIT, indent=2))
    save_file(weights, str(path / VQ_IMAGE_DIR / "model.safetensors"))
    return path
