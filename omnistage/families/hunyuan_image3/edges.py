"""The edge from HunyuanImage-3's autoregressive stage to its image stage: the whole
context (prompt and every generated token) is what the image is denoised after."""

from __future__ import annotations

import torch

from omnistage.core.edge_processor import Accumulate, EdgeProcessor, Payload


class HunyuanImageContext(EdgeProcessor):
    name = "hunyuan_image_context"

    accumulate = {"ids.prompt": Accumulate.REPLACE, "ids.output": Accumulate.CONCAT}

    def to_prior_tokens(self, payload: Payload) -> torch.Tensor:
        return torch.cat([payload["ids.prompt"], payload["ids.output"]]).long()
