"""A tiny random-weight GLM-Image autoregressive prior (`GlmImageForConditionalGeneration`).

`save_tiny_glm_image_prior(path)` writes what the real checkpoint keeps in its
`vision_language_encoder/` folder (config.json with `text_config`,
`vision_config`, `vq_config`; safetensors with transformers' own weight names,
written by `save_pretrained`; generation_config.json) and, into `path` or
`processor_path`, what it keeps in `processor/`: a byte-level tokenizer that
knows GLM-Image's special tokens, the processor's chat template and configs, so
that `AutoProcessor.from_pretrained` builds a `GlmImageProcessor` offline. The
caller decides the folders (the diffusers layout uses `vision_language_encoder/`
and `processor/` side by side).

Token ids follow the real layout at a smaller scale:

- `<|dit_token_i|>` for `i < VISION_VOCAB_SIZE` are ids `0..VISION_VOCAB_SIZE-1`
  (real: 16512), the only ids the prior's `lm_head` scores: image codes
  `0..NUM_IMAGE_CODES-1` (real: the VQ codebook, 16384), then the image start
  (`<|dit_token_{NUM_IMAGE_CODES}|>`, the tokenizer's bos, which ends every
  text-to-image prompt) and the image end (the next id, the prior's eos);
- then the 256 byte tokens, then the text specials (`<|endoftext|>`, `[gMASK]`,
  `<sop>` / `<eop>` which frame a grid size, `<|image|>` the source-image
  placeholder), padded to `TEXT_VOCAB_SIZE` (real: 168064).

The chat template renders a user turn as GLM-Image's does: its text as is and each
image as `<|dit_token_start|><|image|><|dit_token_end|>`, no role markers; the
processor then appends the target grids (`<sop>H W<eop><sop>h w<eop>`) and the
image start token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

NUM_IMAGE_CODES = 128
"""Image codes (the VQ codebook size; real: 16384)."""
VISION_VOCAB_SIZE = 160
"""Ids the prior's `lm_head` scores (real: 16512)."""
IMAGE_START_ID = NUM_IMAGE_CODES
IMAGE_END_ID = NUM_IMAGE_CODES + 1
FIRST_BYTE_ID = VISION_VOCAB_SIZE
TEXT_SPECIALS = ["<|endoftext|>", "[gMASK]", "<sop>", "<eop>", "<|image|>"]
TEXT_VOCAB_SIZE = 448
"""Rows of the token embedding (> 160 dit + 256 byte + 5 special tokens)."""
HIDDEN = 64
HEAD_DIM = 16

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}"
    "{{- '<|dit_token_"
    + str(IMAGE_START_ID)
    + "|><|image|><|dit_token_"
    + str(IMAGE_END_ID)
    + "|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endfor -%}"
)

IMAGE_PROCESSOR_CONFIG = {
    "image_processor_type": "GlmImageImageProcessor",
    "do_resize": True,
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
    "size": {"shortest_edge": 32 * 32, "longest_edge": 256 * 256},
    "patch_size": 16,
    "temporal_patch_size": 1,
    "merge_size": 1,
}


def dit_token(i: int) -> str:
    return f"<|dit_token_{i}|>"


def tiny_glm_image_config():
    """The `GlmImageConfig` of the tiny prior (2 text layers, hidden 64, partial rotary
    0.5 with a 3-D section like the real [8, 12, 12] at a quarter of the scale)."""
    from transformers import GlmImageConfig

    text = dict(
        vocab_size=TEXT_VOCAB_SIZE,
        vision_vocab_size=VISION_VOCAB_SIZE,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HIDDEN // HEAD_DIM,
        num_key_value_heads=2,
        head_dim=HEAD_DIM,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        attention_bias=True,
        pad_token_id=FIRST_BYTE_ID + 256,  # <|endoftext|>
        eos_token_id=IMAGE_END_ID,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [1, 1, 2],  # sums to HEAD_DIM * 0.5 / 2 (real: [8, 12, 12])
        },
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        num_heads=2,
        intermediate_size=64,
        image_size=256,
        patch_size=16,
        spatial_merge_size=1,
    )
    vq = dict(embed_dim=16, num_embeddings=NUM_IMAGE_CODES, latent_channels=32)
    config = GlmImageConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=FIRST_BYTE_ID + 256 + TEXT_SPECIALS.index("<|image|>"),
        image_start_token_id=IMAGE_START_ID,
        image_end_token_id=IMAGE_END_ID,
    )
    config.architectures = ["GlmImageForConditionalGeneration"]
    return config


def tiny_glm_image_tokenizer():
    """Byte-level tokenizer (no merges) with GLM-Image's dit and text special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {dit_token(i): i for i in range(VISION_VOCAB_SIZE)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([dit_token(i) for i in range(VISION_VOCAB_SIZE)] + TEXT_SPECIALS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=dit_token(IMAGE_START_ID),
        eos_token=dit_token(IMAGE_END_ID),
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        extra_special_tokens={
            "image_token": "<|image|>",
            "grid_bos_token": "<sop>",
            "grid_eos_token": "<eop>",
        },
    )
    tok.chat_template = CHAT_TEMPLATE
    if tok.convert_tokens_to_ids("<|endoftext|>") != FIRST_BYTE_ID + 256:
        raise RuntimeError("tiny GLM-Image tokenizer: unexpected special token ids")
    if len(tok) > TEXT_VOCAB_SIZE:
        raise RuntimeError("tiny GLM-Image tokenizer: more tokens than embedding rows")
    return tok


def _randomize(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded weights with well-separated logits (as `tiny_models`): decoder matrices
    N(0, 0.2), encoder / VQ matrices N(0, min(0.2, fan_in ** -0.5)), norm weights N(1, 0.1),
    other vectors N(0, 0.1). The `lm_head` rows of every id but the image codes are zeroed
    (logit 0, below the best random code with overwhelming probability), so the prior
    writes image codes throughout, as a trained one does. Token embeddings are scaled up
    (x3): the sandwich norms keep each residual branch at O(sqrt(hidden)), and a larger
    input token makes greedy decoding cycle less (more distinct codes per image)."""
    with torch.no_grad():
        for mod_name, module in model.named_modules():
            is_norm = type(module).__name__.endswith("RMSNorm") or isinstance(module, nn.LayerNorm)
            for name, p in module.named_parameters(recurse=False):
                full = f"{mod_name}.{name}"
                if is_norm and name == "weight":
                    values = 1.0 + 0.1 * torch.randn(p.shape, generator=generator)
                elif p.dim() >= 2:
                    decoder = full.startswith(("model.language_model", "lm_head"))
                    std = 0.2 if decoder else min(0.2, p[0].numel() ** -0.5)
                    values = std * torch.randn(p.shape, generator=generator)
                else:
                    values = 0.1 * torch.randn(p.shape, generator=generator)
                p.copy_(values)
        model.lm_head.weight[NUM_IMAGE_CODES:] = 0.0
        model.model.language_model.embed_tokens.weight.mul_(3.0)


def save_tiny_glm_image_prior(
    path: Path | str,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    processor_path: Path | str | None = None,
) -> Path:
    """Save a seeded tiny `GlmImageForConditionalGeneration` to `path` and its processor
    (tokenizer, chat template, image-processor config) to `processor_path` (default:
    `path`). Weights are drawn in float32 and cast to `dtype`. Returns `path`."""
    from transformers import GenerationConfig, GlmImageForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_glm_image_config()
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG alone
        torch.manual_seed(seed)
        model = GlmImageForConditionalGeneration(config)
    _randomize(model, torch.Generator().manual_seed(seed))
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.9,
        top_p=0.75,
        eos_token_id=IMAGE_END_ID,
        pad_token_id=config.text_config.pad_token_id,
    )
    model.to(dtype).save_pretrained(path)
    save_tiny_glm_image_processor(path if processor_path is None else Path(processor_path))
    return path


def save_tiny_glm_image_processor(path: Path | str) -> Path:
    """Write the tiny prior's processor files (what GLM-Image keeps in `processor/`)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tiny_glm_image_tokenizer().save_pretrained(path)
    processor_config = {
        "processor_class": "GlmImageProcessor",
        "image_processor": IMAGE_PROCESSOR_CONFIG,
    }
    (path / "processor_config.json").write_text(json.dumps(processor_config, indent=2) + "\n")
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def make_tiny_glm_image(
    path: Path | str, seed: int = 0, dtype: torch.dtype = torch.float64
) -> Path:
    """A whole tiny GLM-Image checkpoint in the real diffusers layout: the prior in
    `vision_language_encoder/`, its tokenizer and processor in `processor/`, the decoder's
    components (`transformer/`, `vae/`, `text_encoder/`, `tokenizer/`, `scheduler/`) and
    `model_index.json` naming `GlmImagePipeline` with all seven."""
    from omnistage.families.glm_image.tiny_decoder import save_tiny_glm_image_decoder

    path = Path(path)
    save_tiny_glm_image_prior(
        path / "vision_language_encoder", dtype, seed, processor_path=path / "processor"
    )
    save_tiny_glm_image_decoder(path, dtype, seed + 1, prior_vocab_size=NUM_IMAGE_CODES)
    return path
