"""The tiny random-weight Covo-Audio checkpoint (the built-in `demo-covo-audio`, and tests).

The real layout and names, tiny sizes: `config.json` (`model_type` "covo_audio", a Qwen2
`llm_config`, a Whisper `encoder_config`, `audio_token_index`), `model.safetensors` with
`llm.*`, `encoder.*` and `audio_adapter.*`, a byte-level tokenizer with Covo-Audio's
audio placeholders (its length is `audio_token_index`: speech code 0 comes right after
the text ids), and `token2wav/` as the reference loads it: `config.json`, `model.pt`
(`token2latent.*`, `wavegan.*`, weight-normed convolutions as `weight_g` / `weight_v`),
`global_mean_var.npy` and the speaker prompt `prompt/*.npy`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

AUDIO_TOKENS = ["<|begofcAUDIO|>", "<|cAUDIO|>", "<|endofcAUDIO|>"]
CODEBOOK = 64
"""Speech codes of the tiny token2wav (16384 in the real one)."""
PROMPT_CODES = 5
SPEAKER_DIM = 24
TOKEN2WAV = {
    "data": {"audio": {"sample_rate": 24000, "hop_size": 16}},
    "model": {
        "type": "Token2WavDecoder",
        "token2latent": {
            "upsample_factor": 4, "token_vocab_size": CODEBOOK, "token_input_dim": 24,
            "z_dim": 8, "spkr_embed_dim": SPEAKER_DIM, "sigma": 1e-05,
            "transformer": {
                "num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 64, "num_heads": 4,
                "modulation": True, "alibi_bias": False, "rotary_bias": True,
                "qk_norm": False, "max_position_embeddings": 4096, "dropout": 0.1,
            },
        },
        "wav_input_sr": 24000,
        "wavegan": {
            "type": "BigVGANFlowVAE", "upsample_rates": [2, 2], "upsample_kernel_sizes": [4, 4],
            "upsample_initial_channel": 16, "resblock": "1",
            "resblock_kernel_sizes": [3, 5], "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5]],
            "downsample_rates": [2, 2], "downsample_channels": [4, 8, 16],
            "activation": "snakebeta", "snake_logscale": True, "latent_dim": 8,
            "use_flow": True, "use_vae": True, "kl_weight": 5, "causal": True,
            "flow_hidden_channels": 16,
        },
        "n_speakers": 1, "n_styles": 1,
    },
    "inference": {"s_steps": 4, "cfg_alpha": 1.0, "dynamic_thr": False, "rescale_logits": False},
}  # fmt: skip
_WEIGHT_NORMED = re.compile(
    r"wavegan\.(conv_pre|conv_post|ups\.\d+\.0|resblocks\.\d+\.convs[12]\.\d+)"
)


def _configs(text_vocab: int):
    from transformers import Qwen2Config, WhisperConfig

    from omnistage.families.covo_audio.config import CovoAudioConfig

    llm = Qwen2Config(
        vocab_size=text_vocab + CODEBOOK, hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"],
    )  # fmt: skip
    encoder = WhisperConfig(
        d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
        num_mel_bins=128, max_source_positions=1500, decoder_layers=1,
        decoder_attention_heads=2, decoder_ffn_dim=32,
    )  # fmt: skip
    config = CovoAudioConfig(llm_config=llm, encoder_config=encoder, audio_token_index=text_vocab)
    config.architectures = ["CovoAudioForCausalLM"]
    return config


def _random_state(module: torch.nn.Module, generator: torch.Generator, std: float) -> dict:
    """Parameters drawn from N(0, std) (norm weights 1); buffers kept."""
    params = dict(module.named_parameters())
    out = {}
    for name, tensor in module.state_dict().items():
        if name not in params:
            out[name] = tensor.clone()
        elif name.endswith("norm.weight") or name.endswith("layer_norm.weight"):
            out[name] = torch.ones_like(tensor)
        else:
            out[name] = torch.randn(tensor.shape, generator=generator) * std
    return out


def _lm_weights(config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    from transformers import Qwen2ForCausalLM
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    state = {}
    for prefix, module in (
        ("llm.", Qwen2ForCausalLM(config.llm_config)),
        ("encoder.", WhisperEncoder(config.encoder_config)),
    ):
        for name, tensor in _random_state(module, generator, 0.2).items():
            state[prefix + name] = tensor.contiguous()
    # Louder speech-code rows, so that the random LM writes codes among its text (the real
    # one interleaves 5 text tokens and 15 codes).
    state["llm.lm_head.weight"][config.audio_token_index :] *= 1.3
    width, hidden = config.whisper_feats_dim, config.llm_config.hidden_size
    for i in range(config.adapter_downsample.bit_length() - 1):
        out = hidden if i == config.adapter_downsample.bit_length() - 2 else width
        layer = f"audio_adapter.downsample_layers.{i}."
        shapes = {
            "conv1d.weight": (width, width, 3), "conv1d.bias": (width,),
            "linear1.weight": (2048, width), "linear1.bias": (2048,),
            "linear2.weight": (out, 2048), "linear2.bias": (out,),
        }  # fmt: skip
        for name, shape in shapes.items():
            state[layer + name] = torch.randn(shape, generator=generator) * 0.05
    return state


def _token2wav(folder: Path, generator: torch.Generator) -> None:
    from omnistage.families.covo_audio.bigvgan import BigVGAN
    from omnistage.families.covo_audio.config import Token2WavConfig
    from omnistage.families.covo_audio.dit import Token2Latent

    config = Token2WavConfig.from_dict(TOKEN2WAV)
    (folder / "prompt").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TOKEN2WAV, indent=2))
    # 3 frames more than the codes give, as the released prompt (291 codes, 1167 frames): the
    # reference then cuts those 3 frames off the request's own latents too.
    frames = PROMPT_CODES * config.dit.upsample_factor + 3
    codes = torch.randint(0, CODEBOOK, (1, PROMPT_CODES), generator=generator)
    np.save(folder / "prompt" / "prompt_token.npy", codes.numpy())
    np.save(
        folder / "prompt" / "prompt_latent.npy",
        torch.randn(1, frames, 8, generator=generator).numpy(),
    )
    np.save(
        folder / "prompt" / "speaker_embed.npy",
        torch.randn(1, SPEAKER_DIM, generator=generator).numpy(),
    )
    mean_var = torch.cat(
        [torch.randn(8, generator=generator) * 0.1, torch.rand(8, generator=generator) + 0.5]
    )
    np.save(folder / "global_mean_var.npy", mean_var.numpy())
    parts = {"token2latent.": Token2Latent(config.dit), "wavegan.": BigVGAN(config.vocoder)}
    state = {}
    for prefix, module in parts.items():
        for name, tensor in _random_state(module, generator, 0.1).items():
            state[prefix + name] = tensor
    torch.save(_weight_normed(state), folder / "model.pt")


def _weight_normed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        stem = name.removesuffix(".weight")
        if name.endswith(".weight") and _WEIGHT_NORMED.fullmatch(stem):
            dims = tuple(range(1, tensor.ndim))
            out[f"{stem}.weight_g"] = tensor.norm(dim=dims, keepdim=True)
            out[f"{stem}.weight_v"] = tensor
        else:
            out[name] = tensor
    return out


def make_tiny_covo_audio(path: str | Path, seed: int = 0) -> Path:
    """Write the tiny checkpoint to `path` (created) and return it."""
    from omnistage.models.tiny_checkpoints import byte_tokenizer, omni_chat_template

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = byte_tokenizer(AUDIO_TOKENS)
    # Text as the byte tokenizer's template renders it; an audio part as its placeholder.
    tokenizer.chat_template = omni_chat_template("".join(AUDIO_TOKENS), "", "")
    tokenizer.save_pretrained(path)
    config = _configs(len(tokenizer))
    config.save_pretrained(path)
    generator = torch.Generator().manual_seed(seed)
    safetensors.torch.save_file(_lm_weights(config, generator), str(path / "model.safetensors"))
    _token2wav(path / "token2wav", generator)
    return path
