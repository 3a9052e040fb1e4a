"""The GLM-Image decoder checkpoint: its layout, its tokenizer, and the request limits
read from it (with `GlmImagePipeline.__call__`'s defaults).

A diffusers-layout directory (`model_index.json` `_class_name: GlmImagePipeline`);
only `transformer/`, `vae/`, `scheduler/`, `text_encoder/` and `tokenizer/` are
read — never `vision_language_encoder/` or `processor/`. Reads configs and the
tokenizer only; the weights are loaded by `GlmImageDecoder.load`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnistage.diffusion.model import MODEL_INDEX, DiffusionLimits
from omnistage.families.glm_image.decoder_inputs import PRIOR_CELL, count_glyph_tokens

COMPONENTS = ("transformer", "vae", "scheduler", "text_encoder", "tokenizer")
PIXELS_PER_PATCH = PRIOR_CELL // 2
"""VAE scale x transformer patch: the prior grid, upsampled 2x, must land on the patches."""
PIPELINE_STEPS = 50
PIPELINE_GUIDANCE = 1.5
PIPELINE_MAX_SEQUENCE_LENGTH = 2048
"""`GlmImagePipeline.__call__` defaults (a test checks them against diffusers)."""
DEFAULT_SAMPLE_SIZE = 128
"""The pipeline's `default_sample_size` when the transformer config has no `sample_size`."""
MAX_SIZE = 2048


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ValueError(f"{path.parent}: GLM-Image decoder checkpoint lacks {path.name}")
    return json.loads(path.read_text())


def check_layout(path: Path) -> dict[str, Any]:
    index = _read_json(path / MODEL_INDEX)
    missing = [name for name in COMPONENTS if not (path / name).is_dir()]
    if missing:
        raise ValueError(f"{path}: GLM-Image decoder checkpoint lacks {', '.join(missing)}/")
    return index


def load_tokenizer(path: Path, index: dict[str, Any]) -> Any:
    """The transformers tokenizer class `model_index.json` names (GLM-Image: ByT5Tokenizer);
    AutoTokenizer when it names none (or a class from another library)."""
    import transformers

    library, name = index.get("tokenizer", [None, None])
    cls = getattr(transformers, name) if library == "transformers" else transformers.AutoTokenizer
    return cls.from_pretrained(path / "tokenizer")


def decoder_limits(path: Path, tokenizer: Any) -> DiffusionLimits:
    transformer = _read_json(path / "transformer" / "config.json")
    vae_scale = 2 ** (len(_read_json(path / "vae" / "config.json")["block_out_channels"]) - 1)
    if vae_scale * transformer["patch_size"] != PIXELS_PER_PATCH:
        raise ValueError(
            f"{path}: VAE scale {vae_scale} x patch size {transformer['patch_size']} must be "
            f"{PIXELS_PER_PATCH}, the prior's {PRIOR_CELL}-pixel grid upsampled 2x"
        )
    default_size = transformer.get("sample_size", DEFAULT_SAMPLE_SIZE) * vae_scale
    return DiffusionLimits(
        default_height=default_size,
        default_width=default_size,
        default_steps=PIPELINE_STEPS,
        default_guidance=PIPELINE_GUIDANCE,
        min_size=PRIOR_CELL,
        max_size=MAX_SIZE,
        size_multiple=PRIOR_CELL,
        max_text_tokens=PIPELINE_MAX_SEQUENCE_LENGTH,
        count_text_tokens=lambda prompt: count_glyph_tokens(tokenizer, prompt),
    )
