"""Tiny random-weight Dynin-Omni checkpoints (tests, the built-in `demo-dynin-omni`).

The layout omnistage serves: the LLaDA model's `config.json` (LLaDA's and Dynin's field
names, `model_type: dynin_omni`), its `model.safetensors` in LLaDA's parameter names, a
byte-level tokenizer with Dynin's special tokens and chat layout (`DYNIN_CHAT_TEMPLATE`), and MAGVITv2's image decoder and
encoder in `vq_model_image/` (its `config.json` states the tiny sizes, the encoder's under
`encoder`; weights in MAGVITv2's names),
and EMOVA's unit-to-speech decoder in `vq_model_audio/` (UVITS names, weight norm as
`weight_g`/`weight_v`, three named styles; see `emova_u2s`), and EMOVA's speech-to-unit
encoder in `s2u/` (`hparams.yaml` + `model.safetensors`, its own generator so the other
weights stay those of checkpoints without it; see `s2u`).
Vocabulary: the tokenizer's ids, then the image codes, then the speech units.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from omnistage.families.dynin_omni.config import (
    MODEL_TYPE,
    SPECIAL_TOKENS,
    TEMPLATE_TOKENS,
    VQ_IMAGE_DIR,
    DyninOmniConfig,
)
from omnistage.families.dynin_omni.prompting import DYNIN_CHAT_TEMPLATE
from omnistage.families.dynin_omni.s2u import S2U_DIR
from omnistage.families.dynin_omni.tiny_s2u import TINY_S2U_LEVELS, make_tiny_s2u
from omnistage.models.tiny_checkpoints import byte_tokenizer

TINY_MAGVIT = {
    "ch": 32,
    "ch_mult": [1, 1],
    "num_res_blocks": [1, 1],
    "z_channels": 6,
    "resolution": 8,
}
"""A 4x4 grid of 6-bit codes -> 8x8 pixels."""
TINY_MAGVIT_ENCODER = {**TINY_MAGVIT, "attn_resolutions": [8]}
"""8x8 pixels -> a 4x4 grid of 6-bit codes; attention in the first level (MAGVITv2's own
`attn_resolutions` [5] never matches a level), so the parity covers that path too."""


TINY_U2S_MODEL = {
    "inter_channels": 4,
    "hidden_channels": 8,
    "filter_channels": 16,
    "n_heads": 2,
    "n_layers": 2,
    "kernel_size": 3,
    "p_dropout": 0.1,
    "resblock": "1",
    "resblock_kernel_sizes": [3, 5],
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
    "upsample_rates": [2, 2],
    "upsample_initial_channel": 16,
    "upsample_kernel_sizes": [4, 4],
    "n_layers_q": 3,
    "use_spectral_norm": False,
    "gin_channels": 8,
    "use_sdp": True,
}
"""UVITS `hps.model` of the tiny speech decoder (4 output samples per frame)."""
TINY_STYLES = (
    "gender-female_emotion-happy_speed-normal_pitch-high",
    "gender-female_emotion-neutral_speed-normal_pitch-normal",
    "gender-male_emotion-sad_speed-slow_pitch-low",
)
NON_UNIT_SYMBOLS = 178
"""UVITS `symbols_with_4096`: pad, punctuation, letters and IPA before the unit numbers."""
_WEIGHT_NORMED = re.compile(
    r"^decoder\.(flow\.flows\.\d+\.enc\.(cond_layer|in_layers\.\d+|res_skip_layers\.\d+)"
    r"|dec\.(ups\.\d+|resblocks\.\d+\.convs[12]?\.\d+))\.weight$"
)


def tiny_config(tokenizer_len: int, mask_id: int, eos_id: int, template_ids: dict) -> dict:
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
        "s2t_max_new_tokens": 8,
        "s2t_steps": 8,  # two steps a block of two: the reference's s2t shape
        "s2t_block_length": 2,
        "image_steps": 4,
        "image_temperature": 1.0,
        "audio_max_new_tokens": 8,
        "audio_steps": 4,
        "audio_block_length": 4,
        "audio_cfg_scale": 2.5,
        "image_guidance_scale": 3.5,
        "t2i_max_text_len": 12,  # "hello" and "Why?" padded, "a cat on a mat" cut
        "t2s_max_text_len": 44,  # the same in the chat wrapping
        "t2s_instruction": "Read this.",
        "mmu_image_resolution": 8,
        **template_ids,
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
    from omnistage.families.dynin_omni.magvit_encoder import EncoderConfig, VQGANEncoder

    path = Path(path)
    (path / VQ_IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer(list(SPECIAL_TOKENS + TEMPLATE_TOKENS))
    tokenizer.chat_template = DYNIN_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(path))
    template_ids = {
        "t2s_token_id": tokenizer.convert_tokens_to_ids("<|t2s|>"),
        "t2i_token_id": tokenizer.convert_tokens_to_ids("<|t2i|>"),
        "ipad_token_id": tokenizer.convert_tokens_to_ids("[iPAD]"),
        # Dynin's <|mmu|> is a reserved id of LLaDA's vocabulary; here byte 0xFF's token,
        # which no UTF-8 text contains.
        "mmu_token_id": tokenizer.convert_tokens_to_ids("\u00ff"),
        "s2t_token_id": tokenizer.convert_tokens_to_ids("\u00fe"),  # byte 0xFE, as <|mmu|>
    }
    config = tiny_config(
        len(tokenizer),
        tokenizer.convert_tokens_to_ids("<|mdm_mask|>"),
        tokenizer.eos_token_id,
        template_ids,
    )
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generator = torch.Generator().manual_seed(seed)
    lm = LLaDAModelLM(DyninOmniConfig.from_dict(config), torch.float32)
    save_file(_randomize(lm, generator, 0.3), str(path / "model.safetensors"))
    decoder = VQGANDecoder(MagvitConfig.from_dict(TINY_MAGVIT), torch.float32)
    weights = {f"decoder.{k}": v for k, v in _randomize(decoder, generator, 0.2).items()}
    make_tiny_emova_u2s(path, config["audio_codebook_size"], generator)
    # The encoder draws last, so the other weights are those of checkpoints without it.
    encoder = VQGANEncoder(EncoderConfig.from_dict(TINY_MAGVIT_ENCODER), torch.float32)
    weights.update({f"encoder.{k}": v for k, v in _randomize(encoder, generator, 0.2).items()})
    vq_config = {**TINY_MAGVIT, "encoder": TINY_MAGVIT_ENCODER}
    (path / VQ_IMAGE_DIR / "config.json").write_text(json.dumps(vq_config, indent=2))
    save_file(weights, str(path / VQ_IMAGE_DIR / "model.safetensors"))
    make_tiny_s2u(path / S2U_DIR, TINY_S2U_LEVELS, torch.Generator().manual_seed(seed + 7919))
    return path


def make_tiny_emova_u2s(path: Path, n_units: int, generator: torch.Generator) -> None:
    """EMOVA's speech decoder for a tiny checkpoint, in `path / vq_model_audio`."""
    from safetensors.torch import save_file

    from omnistage.families.dynin_omni.emova_u2s import VQ_AUDIO_DIR, EmovaU2S, U2SConfig

    raw = {
        "model_type": "emova_speech_tokenizer",
        "u2s_num_styles": len(TINY_STYLES),
        "u2s_dim_styles": TINY_U2S_MODEL["gin_channels"],
        "u2s_style2idx": {name: i for i, name in enumerate(TINY_STYLES)},
        "u2s_config": {
            "num_symbols": NON_UNIT_SYMBOLS + n_units,
            "sampling_rate": 22050,
            "model": TINY_U2S_MODEL,
        },
    }
    (path / VQ_AUDIO_DIR).mkdir(parents=True, exist_ok=True)
    (path / VQ_AUDIO_DIR / "config.json").write_text(json.dumps(raw, indent=2))
    model = EmovaU2S(U2SConfig.from_dict(raw), n_units)
    state = {}
    for name, p in model.state_dict().items():
        std = 0.1 if name.startswith("decoder.dec.") else 0.3  # a waveform short of tanh's 1
        noise = torch.randn(p.shape, generator=generator, dtype=torch.float32) * std
        if name.endswith("GAMMA"):
            noise = noise + 1.0
        elif name == "style_embedding.weight":
            noise = noise / std
        elif name == "decoder.dp.flows.0.m":
            noise[0] -= 1.5  # log-durations near 0..1: units of 1 to 3 frames
        if _WEIGHT_NORMED.match(name):
            scale = 1.0 + 0.1 * torch.randn(p.shape[0], 1, 1, generator=generator)
            state[f"{name}_g"] = noise.norm(dim=(1, 2), keepdim=True) * scale
            state[f"{name}_v"] = noise
        else:
            state[name] = noise
    save_file(state, str(path / VQ_AUDIO_DIR / "model.safetensors"))
