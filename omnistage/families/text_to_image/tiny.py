"""A tiny random-weight think -> recaption -> draw checkpoint (the built-in `demo-image`).

One diffusers-layout directory:

- `thinker/`: a tiny llama chat model (byte tokenizer) with `<think>`,
  `</think>`, `<recaption>`, `</recaption>` as special tokens; its chat
  template opens the assistant turn with `<think>`;
- `text_encoder/` (T5), `tokenizer/` (ByT5, byte-level: nothing to download),
  `transformer/` (diffusers PixArt DiT), `vae/` (AutoencoderKL), `scheduler/`
  (flow matching), and `model_index.json` naming `OmnistageTextToImagePipeline`
  with the drawing settings (`omnistage.families.text_to_image.text_dit`).

Everything is seeded: the same seed writes the same weights. The pictures are
noise and the thoughts are random bytes; the point is that every stage runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnistage.models.tiny_checkpoints import CHAT_TEMPLATE, byte_tokenizer, tiny_config

THINK_TOKENS = ["<think>", "</think>", "<recaption>", "</recaption>"]
THINKER_CHAT_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n<think>{% endif %}"
)
DRAW_SETTINGS = {
    "default_size": 64,
    "default_steps": 8,
    "default_guidance": 4.0,
    "min_size": 32,
    "max_size": 256,
    "max_text_tokens": 128,
}
TEXT_WIDTH = 32


def _scale_weights(module: torch.nn.Module, std: float) -> None:
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.normal_(0, std)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0, 0.05)


def save_tiny_thinker(path: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config("llama", vocab_size=264), dtype=dtype)
    _scale_weights(model, 0.2)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer = byte_tokenizer(THINK_TOKENS)
    tokenizer.chat_template = THINKER_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return path


def save_tiny_text_dit(path: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """The drawing components and `model_index.json` (no thinker)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, PixArtTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    tokenizer = ByT5Tokenizer()
    text_encoder = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=TEXT_WIDTH,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            dropout_rate=0.0,
        )
    ).to(dtype)
    _scale_weights(text_encoder, 0.2)
    transformer = PixArtTransformer2DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        cross_attention_dim=32,
        sample_size=DRAW_SETTINGS["default_size"] // 2,
        patch_size=4,
        caption_channels=TEXT_WIDTH,
        use_additional_conditions=False,
    ).to(dtype)
    _scale_weights(transformer, 0.1)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(8, 16),
        latent_channels=4,
        norm_num_groups=4,
        layers_per_block=1,
        sample_size=DRAW_SETTINGS["default_size"],
    ).to(dtype)
    _scale_weights(vae, 0.2)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)

    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path / "tokenizer")
    text_encoder.save_pretrained(path / "text_encoder")
    transformer.save_pretrained(path / "transformer")
    vae.save_pretrained(path / "vae")
    scheduler.save_pretrained(path / "scheduler")
    index = {
        "_class_name": "OmnistageTextToImagePipeline",
        "_omnistage": DRAW_SETTINGS,
        "tokenizer": ["transformers", "ByT5Tokenizer"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "transformer": ["diffusers", "PixArtTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    }
    (path / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return path


def make_tiny_image_pipeline(path: Path, seed: int = 0, dtype: torch.dtype = torch.float32) -> Path:
    """The whole demo-image checkpoint at `path`: thinker and drawing components."""
    path = Path(path)
    save_tiny_thinker(path / "thinker", seed, dtype)
    save_tiny_text_dit(path, seed + 1, dtype)
    return path
