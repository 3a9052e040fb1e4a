"""`GlmImagePriorPrompter`: a text-to-image prompt as GLM-Image's prior takes it.

As diffusers' `GlmImagePipeline.generate_prior_tokens` does: the checkpoint's processor
renders the user turn and appends the target grids (`<sop>H W<eop><sop>h w<eop>` and
the image start token; `H x W` is the large grid of 32x32-pixel cells, `h x w` a
preview grid of about 16x16); `max_new_tokens` is every grid cell plus one (the end
token). The 3-D positions are transformers' `GlmImageModel.get_rope_index` for a
prompt without source images:

- prompt token `i` at `(i, i, i)`;
- generated tokens fill the grids in reverse order of `image_grid_thw` — the preview
  first, then the large grid — each cell `(r, c)` of a grid at `(b, b + r, b + c)`,
  where `b` starts at the prompt length and grows by `max(rows, cols)` after each
  grid; the end token follows at `(b, b, b)`.

The positions travel as `MultimodalDecoderInputs` (`mrope_positions`,
`decode_positions`). Image-to-image (prompts with source images) is not supported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from omnistage.core.multimodal_inputs import MultimodalDecoderInputs
from omnistage.core.stage_input import StageInput, TokenBudget

GRID_FACTOR = 32
"""Pixels per cell of the large grid (`GlmImageProcessor._get_target_shape`)."""
PREVIEW_SIDE = GRID_FACTOR // 2
"""The preview grid has about `PREVIEW_SIDE**2` cells, shaped like the image."""
_PROCESSOR_FILES = ("processor_config.json", "tokenizer_config.json", "tokenizer.json")


def target_grids(height: int, width: int) -> list[tuple[int, int]]:
    """`[(H, W), (h, w)]`: the large grid and the preview grid of a `height x width`
    image, as `GlmImageProcessor` computes them; ValueError naming `height` / `width`
    when the size has no such grids."""
    for name, value in (("height", height), ("width", width)):
        if not isinstance(value, int) or isinstance(value, bool) or value < GRID_FACTOR:
            raise ValueError(f"{name}: must be an integer >= {GRID_FACTOR}, got {value!r}")
        if value % GRID_FACTOR:
            # The processor would silently round down; the pipeline's decoder would not.
            raise ValueError(f"{name}: must be a multiple of {GRID_FACTOR}, got {value}")
    rows, cols = height // GRID_FACTOR, width // GRID_FACTOR
    ratio = rows / cols
    preview = (int(math.sqrt(ratio) * PREVIEW_SIDE), int(math.sqrt(1 / ratio) * PREVIEW_SIDE))
    if min(preview) < 1:
        name = "height" if preview[0] < 1 else "width"
        raise ValueError(
            f"{name}: {height}x{width} is too elongated: its preview grid would be "
            f"{preview[0]}x{preview[1]} cells"
        )
    return [(rows, cols), preview]


def decode_position_table(start: int, grids: Sequence[tuple[int, int]]) -> torch.Tensor:
    """`[3, sum(h * w) + 1]` (T, H, W) positions of the generated tokens: the grids in
    reverse order, from `start` (the prompt length), then the end token."""
    columns, base = [], start
    for rows, cols in reversed(grids):
        r = torch.arange(rows).repeat_interleave(cols)
        c = torch.arange(cols).repeat(rows)
        columns.append(torch.stack([torch.full_like(r, base), base + r, base + c]))
        base += max(rows, cols)
    columns.append(torch.full((3, 1), base, dtype=torch.long))
    return torch.cat(columns, dim=1)


class GlmImagePriorPrompter:
    """Builds the prior's input from a text prompt and an image size."""

    def __init__(self, processor: Any, config: Any) -> None:
        self.processor = processor
        self.config = config
        tokenizer = processor.tokenizer
        self.image_token_id = tokenizer.convert_tokens_to_ids(processor.image_token)
        self.image_marker_ids = {config.image_start_token_id, config.image_end_token_id}

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, processor_path: str | Path | None = None, dtype: Any = None
    ) -> GlmImagePriorPrompter:
        """The prior checkpoint at `path` (its `config.json`) and its processor, loaded with
        `AutoProcessor` offline from `processor_path`; by default `path` itself, or the
        `processor/` folder next to it (diffusers' layout: `vision_language_encoder/`)."""
        from transformers import AutoConfig, AutoProcessor

        path = Path(path)
        if processor_path is None:
            sibling = path.parent / "processor"
            own = any((path / f).is_file() for f in _PROCESSOR_FILES)
            processor_path = sibling if not own and sibling.is_dir() else path
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
            processor = AutoProcessor.from_pretrained(processor_path, local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: cannot load the GLM-Image prior's processor ({e})") from e
        if getattr(config, "model_type", None) != "glm_image":
            raise ValueError(
                f"{path}: not a GLM-Image prior checkpoint "
                f"(model_type {getattr(config, 'model_type', None)!r})"
            )
        return cls(processor, config)

    def request_input(self, stage: str, msg: Any) -> tuple[StageInput, TokenBudget]:
        """An entry stage's input for a request (`SubmitRequest`): the prompt with the
        target grids of its `image_size` and the 3-D positions of what the prior writes,
        and how many tokens it writes (exactly the grids' cells plus the end, whatever
        `max_tokens` was asked). ValueError naming the field for a request the prior
        cannot serve."""
        prompt, image_size = msg.prompt, msg.image_size
        if msg.images:
            raise ValueError(
                f"images: stage {stage!r} (GLM-Image prior) does not support image-to-image prompts"
            )
        if prompt is None:
            raise ValueError(f"prompt: stage {stage!r} (GLM-Image prior) needs a text prompt")
        if image_size is None or len(image_size) != 2:
            raise ValueError(
                f"image_size: stage {stage!r} (GLM-Image prior) needs the size of the "
                f"image to draw as [height, width], got {image_size!r}"
            )
        height, width = image_size
        return self.build(prompt, height, width), TokenBudget(self.max_new_tokens(height, width))

    def max_new_tokens(self, height: int, width: int) -> int:
        """Tokens the prior writes for a `height x width` image: every cell, then the end."""
        return sum(rows * cols for rows, cols in target_grids(height, width)) + 1

    def build(
        self, prompt: str, height: int, width: int, images: Sequence[Any] | None = None
    ) -> StageInput:
        """The prompt's token ids and 3-D positions for a `height x width` image.

        ValueError naming `height` / `width` for a size the grids cannot take, `images`
        (or `prompt`, for image placeholder tokens) for image-to-image prompts."""
        if images:
            raise ValueError(
                "images: GLM-Image image-to-image (a prompt with source images) is not "
                "supported; give a text prompt"
            )
        if not isinstance(prompt, str):
            raise ValueError(f"prompt: expected a string, got {type(prompt).__name__}")
        if self.processor.image_token in prompt:
            raise ValueError(
                f"prompt: holds the image placeholder {self.processor.image_token}; "
                "GLM-Image image-to-image is not supported"
            )
        grids = target_grids(height, width)
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        encoded = self.processor.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            processor_kwargs={"target_h": height, "target_w": width},
        )
        ids = encoded["input_ids"][0].tolist()
        found = encoded["image_grid_thw"][:, 1:].tolist()
        if [tuple(g) for g in found] != grids:  # the processor's arithmetic changed
            raise ValueError(f"height/width: the processor gives grids {found}, expected {grids}")
        if self.image_token_id in ids or self.image_marker_ids & set(ids[:-1]):
            raise ValueError(
                "prompt: holds image start / end tokens; GLM-Image image-to-image is not supported"
            )
        positions = torch.arange(len(ids)).expand(3, -1).clone()
        return StageInput(
            prompt=prompt,
            prompt_token_ids=ids,
            mm_decoder_inputs=MultimodalDecoderInputs(
                mrope_positions=positions,
                decode_positions=decode_position_table(len(ids), grids),
            ),
        )
