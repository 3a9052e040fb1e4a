"""A tiny random-weight Qwen2.5-Omni (`Qwen2_5OmniForConditionalGeneration`) checkpoint.

The checkpoint has the real HF layout: one `config.json` with `thinker_config`
(text, audio and vision sub-configs), `talker_config` and `token2wav_config`
(`dit_config`, `bigvgan_config`; see `tiny_qwen25_omni_config`); safetensors with
the real weight names (`thinker.{model,lm_head,audio_tower,visual}.*`,
`talker.{thinker_to_talker_proj,model,codec_head}.*`,
`token2wav.{code2wav_dit_model,code2wav_bigvgan_model}.*`, written by
`save_pretrained`); a `generation_config.json`; the speaker file `spk_dict.pt`
that `Qwen2_5OmniForConditionalGeneration.from_pretrained` requires
(`torch.load(weights_only=True)` of `{name: {"bos_token": int, "cond": [1, enc_emb_dim],
"ref_mel": [1, frames, mel_dim]}}` for "Chelsie" and "Ethan"); and the files
`AutoProcessor` (`Qwen2_5OmniProcessor`) reads (`tiny_qwen25_omni_processor`). This
module draws the seeded weights and writes the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from omnistage.families.qwen25_omni.tiny_config import (
    CODEBOOK_SIZE,
    MEL_DIM,
    REF_MEL_FRAMES,
    SPEAKER_COND_DIM,
    SPEAKERS,
    tiny_qwen25_omni_config,
)
from omnistage.families.qwen25_omni.tiny_processor import (
    CHAT_TEMPLATE,
    ENDOFTEXT_ID,
    FEATURE_EXTRACTOR_CONFIG,
    IM_END_ID,
    IMAGE_PROCESSOR_CONFIG,
    SPEAKER_BOS,
    THINKER_VOCAB_SIZE,
    VIDEO_PROCESSOR_CONFIG,
    tiny_qwen25_omni_tokenizer,
)


def _randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded weights large enough that logits are well separated (as in tiny_models).

    Decoder matrices (thinker text model, talker) get N(0, 0.2) like tiny_models;
    encoder, DiT and vocoder matrices N(0, min(0.2, fan_in**-0.5)) so their
    activations stay O(1); norm weights (RMSNorm, LayerNorm, BatchNorm) N(1, 0.1);
    other vectors N(0, 0.1). Then, so that the random model behaves like a usable one
    (a zero row gives logit 0, below the maximum of the other random logits with
    overwhelming probability):

    - thinker `lm_head` rows of every id except the 256 byte tokens and
      `<|im_end|>` are zeroed: the thinker writes byte text and may end it.
    - talker `codec_head` rows of every id from `CODEBOOK_SIZE` up (the codec
      control ids, the end ids `TALKER_EOS_IDS` among them) are zeroed: the talker
      writes only codes the DiT knows and never ends by itself, so it always
      writes `talker_max_new_tokens` codes.
    - the talker's codec embeddings are scaled up (x3) and its attention / MLP
      output projections down (x0.5), so that each step's input (the last code)
      rather than the shared prompt decides the next code and codes vary.
    - BigVGAN's last convolution is scaled by 0.1 so that the waveform stays
      mostly inside the final clamp to [-1, 1] (a clipped signal would hide
      differences in parity tests).
    """
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = isinstance(module, (nn.LayerNorm, nn.BatchNorm1d)) or type(
                module
            ).__name__.endswith("RMSNorm")
            for name, p in module.named_parameters(recurse=False):
                full = f"{mod_name}.{name}"
                if is_norm and name == "weight":
                    values = 1.0 + 0.1 * torch.randn(p.shape, generator=generator)
                elif p.dim() >= 2:
                    if full.startswith(
                        ("thinker.model.language_model", "thinker.lm_head", "talker")
                    ):
                        std = 0.2
                    else:
                        std = min(0.2, p[0].numel() ** -0.5)
                    values = std * torch.randn(p.shape, generator=generator)
                else:
                    values = 0.1 * torch.randn(p.shape, generator=generator)
                p.copy_(values)
        keep = torch.zeros(THINKER_VOCAB_SIZE, dtype=torch.bool)
        keep[3:259] = True  # byte tokens
        keep[IM_END_ID] = True
        model.thinker.lm_head.weight[~keep] = 0.0
        model.talker.codec_head.weight[CODEBOOK_SIZE:] = 0.0
        model.talker.model.embed_tokens.weight.mul_(3.0)
        for name, p in model.talker.model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.mul_(0.5)
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(0.1)


def speaker_dict(generator: torch.Generator) -> dict[str, dict]:
    """`spk_dict.pt`'s content: per speaker its text-side bos token and DiT conditioning."""
    return {
        name: {
            "bos_token": SPEAKER_BOS[name],
            "cond": torch.randn(1, SPEAKER_COND_DIM, generator=generator),
            "ref_mel": torch.randn(1, REF_MEL_FRAMES, MEL_DIM, generator=generator) - 4.0,
        }
        for name in SPEAKERS
    }


def make_tiny_qwen25_omni(path: Path, dtype=torch.float32, seed: int = 0) -> Path:
    """Save a seeded tiny `Qwen2_5OmniForConditionalGeneration` checkpoint with its speaker
    file and processor files. All weights are drawn in float32 (a float64 checkpoint is the
    float32 one upcast); the token2wav weights are saved in float32 whatever `dtype` is, as
    transformers keeps that part in float32 (`enable_talker` calls `token2wav.float()`)."""
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen25_omni_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = Qwen2_5OmniForConditionalGeneration(config)
    generator = torch.Generator().manual_seed(seed)
    _randomize(model, generator)
    model.to(dtype)
    model.token2wav.float()
    model.generation_config = GenerationConfig(
        bos_token_id=ENDOFTEXT_ID, eos_token_id=IM_END_ID, pad_token_id=ENDOFTEXT_ID
    )
    model.save_pretrained(path)
    torch.save(speaker_dict(generator), path / "spk_dict.pt")

    tok = tiny_qwen25_omni_tokenizer()
    tok.save_pretrained(path)
    processor_config = {
        "processor_class": "Qwen2_5OmniProcessor",
        "feature_extractor": FEATURE_EXTRACTOR_CONFIG,
        "image_processor": IMAGE_PROCESSOR_CONFIG,
        "video_processor": VIDEO_PROCESSOR_CONFIG,
    }
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path
