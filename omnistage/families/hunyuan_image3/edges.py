"""The edge from HunyuanImage-3's autoregressive stage to its image stage: the whole
context (prompt and every generated token) is what the image is denoised after.

The context goes as token ids; a prompt with input images (an edit) also sends the
thinker's input rows of its prompt (`embed.prefill`: the images' VAE and ViT rows are the
encoders', not the ids' embeddings) and the images' patch grids, so the draw stage
attends to the same image rows as the thinker did (`edit_context.py`). They reach the
draw model as a `HunyuanImageHandOff`, with the prompt's length: the image to draw opens
after the prompt's own image blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.core.edge_processor import (
    IMAGE_GRID_KEY,
    PREFILL_KEY,
    Accumulate,
    EdgeProcessor,
    Payload,
)


@dataclass(frozen=True)
class HunyuanImageHandOff:
    """What the draw stage gets besides the context's ids."""

    prompt_len: int
    rows: torch.Tensor | None = None
    """[prompt_len, hidden]: the thinker's input rows of a prompt with images (else None)."""
    grids: torch.Tensor | None = None
    """[images, 3]: the input images' ViT patch grids (else None)."""


class HunyuanImageContext(EdgeProcessor):
    name = "hunyuan_image_context"

    accumulate = {
        "ids.prompt": Accumulate.REPLACE,
        "ids.output": Accumulate.CONCAT,
        IMAGE_GRID_KEY: Accumulate.REPLACE,
        PREFILL_KEY: Accumulate.REPLACE,
    }

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        return torch.cat([payload["ids.prompt"], payload["ids.output"]]).long()

    def to_diffusion_input(self, payload: Payload) -> dict[str, Any]:
        prompt_len = int(payload["ids.prompt"].shape[0])
        grids, rows = payload.get(IMAGE_GRID_KEY), payload.get(PREFILL_KEY)
        if grids is not None and (rows is None or rows.shape[0] != prompt_len):
            raise ValueError(
                f"image: {self.name}: a prompt with images needs its {prompt_len} input rows "
                f"({PREFILL_KEY}) in the payload"
            )
        hand_off = HunyuanImageHandOff(prompt_len, rows if grids is not None else None, grids)
        return {"prior_token_ids": self.to_prior_tokens(payload), "hand_off": hand_off}
