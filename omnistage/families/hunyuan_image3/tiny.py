"""A tiny random-weight HunyuanImage-3 checkpoint: config.json with the real fields,
safetensors with the real parameter names (decoder, image head, VAE decoder and encoder,
the SigLIP2 vision encoder and its aligner), a byte-level tokenizer with its special tokens whose
chat template opens the answer as the request's `bot_task` asks (`<think>` by default),
and the `model_index.json` omnistage's image stage reads (`pipeline.PIPELINE_CLASS`, a
few denoising steps); the built-in `demo-hunyuan-image3`.

The decoder is the real one at toy size: grouped-query attention with RMSNorm on q
and k, a dense first layer (`moe_layer_num_skipped: 1`) and MoE layers with top-2
routing over 4 experts plus a shared expert (`use_mixed_mlp_moe`). Special token ids
follow the byte tokenizer's layout (`omnistage.models.tiny_checkpoints`): 3 text
specials, 256 bytes, then `special_token_names` in order from id 259.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from omnistage.families.hunyuan_image3.config import MODEL_TYPE, HunyuanImage3Config
from omnistage.families.hunyuan_image3.image_head import ImageHead
from omnistage.families.hunyuan_image3.model import HunyuanImage3Model
from omnistage.families.hunyuan_image3.pipeline import PIPELINE_CLASS
from omnistage.families.hunyuan_image3.tokens import special_token_names
from omnistage.families.hunyuan_image3.vae_decoder import VaeDecoder
from omnistage.families.hunyuan_image3.vae_encoder import VaeEncoder
from omnistage.families.hunyuan_image3.vision import HunyuanVisionEncoder
from omnistage.models.tiny_checkpoints import CHAT_TEMPLATE, byte_tokenizer

IMAGE_BASE_SIZE = 256
"""`<img_size_256>`: the tiny model's base image size (real: 1024); with the VAE's 16x
downsampling a 1:1 image is 16 x 16 latent tokens."""
FIRST_SPECIAL_ID = 259
BOT_TASKS = ("think_recaption", "recaption", "image", "auto")
"""The answer's first section, by the request's `bot_task` (`chat_template_kwargs`); auto:
none (the model's own choice, e.g. a plain text answer about an input image)."""
CONTENT = (
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}<boi><img><eoi>{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)
"""A message's content: its text, each image part as `<boi><img><eoi>` (the multimodal
processor's placeholder)."""


def bot_task_template(image_base_size: int) -> str:
    """The byte tokenizer's template with the assistant turn opened as the reference's
    `bot_task` prefixes it: `<think>` (think_recaption, the default), `<recaption>`, nothing
    (auto), or `<answer><boi><img_size_B>` (image: the sampler picks the ratio and ends).
    Another bot_task is refused by name."""
    opening = (
        "{% set task = bot_task | default('think_recaption') %}"
        "{% if task == 'think_recaption' %}<think>"
        "{% elif task == 'recaption' %}<recaption>"
        f"{{% elif task == 'image' %}}<answer><boi><img_size_{image_base_size}>"
        "{% elif task == 'auto' %}"
        "{% else %}{{ raise_exception('bot_task: expected one of "
        + ", ".join(BOT_TASKS)
        + ", got ' ~ task) }}{% endif %}"
    )
    template = CHAT_TEMPLATE.replace("{{ m['content'] }}", CONTENT)
    return template.replace(
        "<|im_start|>assistant\n{% endif %}", "<|im_start|>assistant\n" + opening + "{% endif %}"
    )


DRAW_SETTINGS = {"default_steps": 4, "default_guidance": 2.5, "flow_shift": 3.0}

TINY_CONFIG: dict[str, Any] = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=[32, 32, 32],  # one per layer (the reference reads both forms)
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_head_dim=16,
    max_position_embeddings=1024,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    rope_scaling={"type": "custom", "factor": 1.0},
    use_qk_norm=True,
    use_rotary_pos_emb=True,
    num_experts=4,
    moe_topk=[2, 2, 2],
    num_shared_expert=[1, 1, 1],
    use_mixed_mlp_moe=True,
    moe_layer_num_skipped=1,
    norm_topk_prob=True,
    norm_type="rms",
    hidden_act="silu",
    attention_bias=False,
    mlp_bias=False,
    tie_word_embeddings=False,
    image_base_size=IMAGE_BASE_SIZE,
    img_proj_type="unet",
    patch_size=1,
    patch_embed_hidden_dim=32,
    vae_downsample_factor=[16, 16],
    vae=dict(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=[32, 32, 32, 32, 32],
        layers_per_block=1,
        ffactor_spatial=16,
        ffactor_temporal=2,
        sample_size=256,
        sample_tsize=8,
        scaling_factor=0.75,
    ),
    vit=dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_channels=3,
        num_patches=16,
        patch_size=16,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6,
        attention_dropout=0.0,
        vision_use_head=False,
        _attn_implementation="sdpa",
        output_attentions=False,
        output_hidden_states=False,
        use_return_dict=True,
    ),
    vit_processor=dict(patch_size=16, max_num_patches=16),
    vit_aligner=dict(projector_type="mlp_gelu", input_dim=32, n_embed=64, depth=2),
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)


def token_ids(image_base_size: int = IMAGE_BASE_SIZE) -> dict[str, int]:
    """The tiny tokenizer's ids of the special tokens (the same ids for every base size)."""
    names = special_token_names(image_base_size)
    return {name: FIRST_SPECIAL_ID + i for i, name in enumerate(names)}


def random_lm_weights(config: HunyuanImage3Config, seed: int) -> dict[str, torch.Tensor]:
    """The decoder's tensors by checkpoint name, seeded, scaled so logits are well apart."""
    shapes = HunyuanImage3Model(config, torch.float32, 8)
    named = [(f"model.{n}", p.shape) for n, p in shapes.named_parameters()]
    named.append(("lm_head.weight", (config.vocab_size, config.hidden_size)))
    return _random(named, seed)


def random_image_head_weights(config: HunyuanImage3Config, seed: int) -> dict[str, torch.Tensor]:
    """The image head's tensors (`image_head.ImageHead`) by checkpoint name, seeded."""
    head = ImageHead(config, torch.float32)
    return _random([(n, p.shape) for n, p in head.named_parameters()], seed + 1)


def random_vae_decoder_weights(config: HunyuanImage3Config, seed: int) -> dict[str, torch.Tensor]:
    """The VAE decoder's tensors (`vae.decoder.*`), seeded."""
    vae = VaeDecoder(config.vae, torch.float32)
    return _random([(f"vae.decoder.{n}", p.shape) for n, p in vae.named_parameters()], seed + 2)


def random_vae_encoder_weights(config: HunyuanImage3Config, seed: int) -> dict[str, torch.Tensor]:
    """The VAE encoder's tensors (`vae.encoder.*`), seeded."""
    vae = VaeEncoder(config.vae, torch.float32)
    return _random([(f"vae.encoder.{n}", p.shape) for n, p in vae.named_parameters()], seed + 4)


def random_vision_weights(config: HunyuanImage3Config, seed: int) -> dict[str, torch.Tensor]:
    """The vision encoder's tensors (`vision_model.*`, `vision_aligner.*`), seeded."""
    encoder = HunyuanVisionEncoder(config, torch.float32)
    return _random([(n, p.shape) for n, p in encoder.named_parameters()], seed + 3)


def _random(named: list[tuple[str, Any]], seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, shape in named:
        if len(shape) >= 2:
            tensor = torch.randn(shape, generator=generator) * 0.2
        elif name.endswith(".weight"):  # a norm's scale (RMSNorm, GroupNorm)
            tensor = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            tensor = 0.1 * torch.randn(shape, generator=generator)
        out[name] = tensor.contiguous()
    return out


def make_tiny_hunyuan_image3(path: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Write the checkpoint into `path` (created); returns it. `overrides` replace config
    fields (`image_base_size=64`: only 64 x 64 images, 4 x 4 latent tokens, for fast tests)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    values = {**TINY_CONFIG, **overrides}
    config = HunyuanImage3Config(**values)
    weights = {
        **random_lm_weights(config, seed),
        **random_image_head_weights(config, seed),
        **random_vae_decoder_weights(config, seed),
        **random_vision_weights(config, seed),
        **random_vae_encoder_weights(config, seed),
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    values.update(architectures=["HunyuanImage3ForCausalMM"], model_type=MODEL_TYPE)
    (path / "config.json").write_text(json.dumps(values, indent=1))
    index = {"_class_name": PIPELINE_CLASS, **DRAW_SETTINGS}
    (path / "model_index.json").write_text(json.dumps(index, indent=1))
    tokenizer = byte_tokenizer(special_token_names(config.image_base_size))
    tokenizer.chat_template = bot_task_template(config.image_base_size)
    tokenizer.save_pretrained(path)
    return path
