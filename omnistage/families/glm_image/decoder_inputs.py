"""What the GLM-Image decoder reads from a request: the prompt's glyph texts and the
prior's image tokens, tokenized and laid out as `GlmImagePipeline` hands them to the
transformer.

The prior writes image tokens on a grid of `PRIOR_CELL`-pixel cells: first a small
*preview* grid, then the *large* grid of the target size, then an end token. The
transformer reads only the large grid, upsampled 2x. The glyph encoder reads the
prompt's quoted texts ('…', “…”, "…", 「…」), one token row per text.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

PRIOR_CELL = 32
"""Pixels per prior token (the prior processor's `_get_target_shape` factor)."""

_GLYPH_PATTERNS = (r"'([^']*)'", r"\u201c([^\u201c\u201d]*)\u201d", r'"([^"]*)"', r"「([^「」]*)」")


# -- the prompt: glyph texts ----------------------------------------------------------------------
def glyph_texts(prompt: str) -> list[str]:
    """The quoted texts of `prompt` the image should render ('…', “…”, "…", 「…」), in the
    pipeline's order (`GlmImagePipeline.get_glyph_texts`)."""
    return [text for pattern in _GLYPH_PATTERNS for text in re.findall(pattern, prompt)]


def glyph_token_ids(tokenizer: Any, prompt: str, max_length: int | None = None) -> list[list[int]]:
    """One token row per glyph text ([""] when there is none), as `_get_glyph_embeds` feeds
    the glyph encoder. Its quirk is kept: a pad token is prepended to *every* row when the
    *number* of texts is even. `max_length` truncates each row (the pipeline's
    `max_sequence_length`); None leaves them whole."""
    texts = glyph_texts(prompt) or [""]
    truncate = {"max_length": max_length, "truncation": True} if max_length else {}
    rows = tokenizer(texts, **truncate).input_ids
    pad = [tokenizer.pad_token_id] * ((len(rows) + 1) % 2)
    return [pad + row for row in rows]


def count_glyph_tokens(tokenizer: Any, prompt: str) -> int:
    """The length of the glyph sequence `prompt` gives the transformer (untruncated)."""
    return sum(len(row) for row in glyph_token_ids(tokenizer, prompt))


# -- the prior tokens -----------------------------------------------------------------------------
def prior_grids(height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(large, preview) prior grids for a text-to-image target of `height` x `width` pixels
    (`GlmImageProcessor._get_target_shape`)."""
    token_h, token_w = height // PRIOR_CELL, width // PRIOR_CELL
    ratio = token_h / token_w
    preview_h = int(math.sqrt(ratio) * (PRIOR_CELL // 2))
    preview_w = int(math.sqrt(1 / ratio) * (PRIOR_CELL // 2))
    return (token_h, token_w), (preview_h, preview_w)


def large_prior_tokens(
    prior_token_ids: torch.Tensor | None, height: int, width: int, vocab_size: int
) -> torch.Tensor:
    """The large-grid tokens of everything the prior generated (preview grid, large grid,
    end token), upsampled 2x: `[1, (height // 16) * (width // 16)]` long, as the pipeline
    hands them to the transformer. ValueError naming `prior_token_ids` when they are
    missing, do not fit the size, or hold ids the transformer cannot embed."""
    from diffusers import GlmImagePipeline

    if prior_token_ids is None:
        raise ValueError("prior_token_ids: GLM-Image needs the prior's image tokens; none given")
    (token_h, token_w), preview = prior_grids(height, width)
    grid_thw = torch.tensor([[1, token_h, token_w], [1, *preview]])
    max_new_tokens, offset, token_h, token_w = GlmImagePipeline._compute_generation_params(
        grid_thw, is_text_to_image=True
    )
    tokens = torch.as_tensor(prior_token_ids).reshape(-1)
    needed = max_new_tokens - 1  # preview + large; the end token may be left off
    if len(tokens) not in (needed, needed + 1):
        raise ValueError(
            f"prior_token_ids: {len(tokens)} tokens, but a {height}x{width} image takes "
            f"{offset} preview + {token_h * token_w} large-grid tokens (+ 1 end token); "
            "was the prior run for another size, or did it stop early?"
        )
    large = GlmImagePipeline._extract_large_image_tokens(
        tokens.long().unsqueeze(0), 0, offset, token_h * token_w
    )
    bad = (large < 0) | (large >= vocab_size)
    if bad.any():
        position = int(bad.nonzero()[0])
        raise ValueError(
            f"prior_token_ids: large-grid token {position} is {int(large[position])}, outside "
            f"the decoder's prior vocabulary of {vocab_size}"
        )
    return GlmImagePipeline._upsample_token_ids(large, token_h, token_w)
