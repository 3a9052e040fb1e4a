"""`StageInput`: what an AR consumer stage starts a request from (prompt ids or text,
prompt embeddings, conditioning rows, multimodal decoder inputs).

The pipeline's edge processors build it from a producer's payload, and a model family's
prompt builder may build it too (GLM-Image's prior), so it lives below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StageInput:
    """What an AR consumer stage starts a request from."""

    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None
    conditioning: torch.Tensor | None = None
    """Rows added to the input embeddings of the generated positions, one each."""
    conditioning_fill: torch.Tensor | None = None
    """The row of every generated position past the last of `conditioning`."""
    mm_decoder_inputs: Any = None
    """`MultimodalDecoderInputs` of a prompt with images (3-D positions, deepstack)."""
    image_grid_thw: torch.Tensor | None = None
    """`[images, 3]` patch grids of the prompt's images (an entry stage's encoded media);
    the stage hands them on to edges that collect `IMAGE_GRID_KEY`."""
    output_context: torch.Tensor | None = None
    """`[frames, codes]` codec frames the consumer of this stage's frames decodes as left
    context before the first (a cloned voice's reference codes: `CONTEXT_CODES_KEY`)."""


@dataclass(frozen=True)
class TokenBudget:
    """What a model that renders its own prompt says about how much a request writes
    (replacing the stage's defaults and the request's own)."""

    max_tokens: int
    min_tokens: int = 0
    """Stop ids and EOS are masked until this many tokens are written."""
    stop_token_ids: tuple[int, ...] = ()
    """Ids that end the request, besides the model's EOS."""
