"""A tiny random-weight Qwen3-Omni (`Qwen3OmniMoeForConditionalGeneration`) checkpoint.

The checkpoint has the real HF layout: one `config.json` with `thinker_config`,
`talker_config` and `code2wav_config` (`tiny_qwen3_omni_config`); safetensors with
the real weight names (`thinker.*`, `talker.*`, `code2wav.*`, MoE experts stored
per expert as on the Hub, written by `save_pretrained`); a
`generation_config.json`; and the files `AutoProcessor` (`Qwen3OmniMoeProcessor`)
reads (`tiny_qwen3_omni_processor`). This module draws the seeded weights and
writes the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from omnistage.families.qwen3_omni.tiny_config import CODEC_IDS, tiny_qwen3_omni_config
from omnistage.families.qwen3_omni.tiny_processor import (
    CHAT_TEMPLATE,
    FEATURE_EXTRACTOR_CONFIG,
    IM_END_ID,
    IMAGE_PROCESSOR_CONFIG,
    THINKER_VOCAB_SIZE,
    VIDEO_PROCESSOR_CONFIG,
    tiny_qwen3_omni_tokenizer,
)


def _randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded weights large enough that logits are well separated (as in tiny_models).

    Decoder matrices get N(0, 0.2) like tiny_models; encoder and vocoder
    matrices N(0, min(0.2, fan_in**-0.5)) so their activations stay O(1); norm
    weights N(1, 0.1); other vectors N(0, 0.1). Some output rows are then zeroed
    so that the random model behaves like a usable one (a zero row gives logit 0,
    below the maximum of the other random logits with overwhelming probability):

    - thinker `lm_head` rows of every id except the 256 byte tokens and
      `<|im_end|>`: the thinker writes byte text and may end it, never unused
      vocabulary rows nor multimodal / TTS control tokens.
    - talker `codec_head` row of `codec_eos`: the talker never ends by itself, so
      it always writes `talker_max_new_tokens - 1` frames (an immediate EOS also
      crashes transformers' `generate`, which stacks an empty list of codes). A
      test makes it end at a chosen step with a `codec_eos` logit bias and
      `min_tokens` (tests/pipeline/test_qwen3_omni_pipeline.py).

    The vocoder's last convolution is scaled by 0.1 so that the waveform mostly
    stays inside code2wav's final clamp to [-1, 1] (a clipped signal would hide
    differences in parity tests), and the talker's codec embeddings are scaled up
    (x3) and its attention / MLP output projections down (x0.5) so that its
    first-codebook codes vary from frame to frame.
    """
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
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
        model.talker.codec_head.weight[CODEC_IDS["codec_eos_token_id"]] = 0.0
        for p in model.code2wav.decoder[-1].parameters():
            p.mul_(0.1)
        # Talker: larger codec embeddings and smaller residual-branch outputs, so that each
        # step's input (the previous frame's codes + one text token) rather than the shared
        # prompt decides the next code; otherwise one code wins at nearly every step.
        for emb in [
            model.talker.model.codec_embedding,
            *model.talker.code_predictor.model.codec_embedding,
        ]:
            emb.weight.mul_(3.0)
        for name, p in model.talker.model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                p.mul_(0.5)


def make_tiny_qwen3_omni(path: Path, seed: int = 0, dtype=torch.float32) -> Path:
    """Save a seeded tiny `Qwen3OmniMoeForConditionalGeneration` checkpoint with its processor files."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen3_omni_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = Qwen3OmniMoeForConditionalGeneration(config)
    # Drawn in float32 whatever `dtype` is: a float64 checkpoint is the float32 one upcast.
    _randomize(model, torch.Generator().manual_seed(seed))
    model.to(dtype).save_pretrained(path)

    tok = tiny_qwen3_omni_tokenizer()
    tok.save_pretrained(path)
    processor_config = {
        "processor_class": "Qwen3OmniMoeProcessor",
        "feature_extractor": FEATURE_EXTRACTOR_CONFIG,
        "image_processor": IMAGE_PROCESSOR_CONFIG,
        "video_processor": VIDEO_PROCESSOR_CONFIG,
    }
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path
