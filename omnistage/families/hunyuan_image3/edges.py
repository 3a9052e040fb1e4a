"""The edge from HunyuanImage-3's autoregressive stage to its image stage: the whole
context (prompt and every generated token) is what the image is denoised after.

The context goes as token ids, so a prompt's input image (its rows are the encoders',
not the ids' embeddings) cannot follow: such a request is refused here, naming the
image, rather than drawn from a context without its picture (image editing is not
built)."""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import IMAGE_GRID_KEY, Accumulate, EdgeProcessor, Payload


class HunyuanImageContext(EdgeProcessor):
    name = "hunyuan_image_context"

    accumulate = {
        "ids.prompt": Accumulate.REPLACE,
        "ids.output": Accumulate.CONCAT,
        IMAGE_GRID_KEY: Accumulate.REPLACE,
    }

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        if payload.get(IMAGE_GRID_KEY) is not None:
            raise ValueError(
                "image: HunyuanImage-3 draws no image from a prompt with an input image "
                "(image editing is not supported); ask for text only"
            )
        return torch.cat([payload["ids.prompt"], payload["ids.output"]]).long()
