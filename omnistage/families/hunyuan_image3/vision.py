"""HunyuanImage-3's vision encoder: what turns an input image into the rows of its ViT
tokens in the context (the `vit` half of the reference's joint image).

Two modules of the checkpoint, under its names:

- `vision_model.*`: a SigLIP2 vision transformer (the reference's `siglip2.py` is
  transformers' `Siglip2VisionTransformer`, copied; here transformers'
  `Siglip2VisionModel` built from the config's `vit` dict): patches of the image as
  `Siglip2ImageProcessorPil` cuts them (the reference's fast processor, on PIL) (`vit_processor`: patch size and `max_num_patches`),
  its last hidden state after `post_layernorm` (the pooling head, if the config has
  one, is not used: the reference reads `last_hidden_state`);
- `vision_aligner.*`: the reference's `LightProjector` (`vit_aligner`): `linear`, or
  `mlp_gelu` of `depth` linears with GELU between them, to the decoder's width.

Every one of the `max_num_patches` rows goes into the context, padded patches too (the
reference's `image_token_length` is `max_num_patches`; its attention mask only hides the
padding from the encoder's own attention).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import Siglip2ImageProcessorPil, Siglip2VisionConfig, Siglip2VisionModel

from omnistage.families.hunyuan_image3.weights import load_part

PREFIXES = ("vision_model.", "vision_aligner.")
VIT_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_channels",
    "num_patches",
    "patch_size",
    "hidden_act",
    "layer_norm_eps",
    "attention_dropout",
    "vision_use_head",
)
"""The `vit` fields the encoder's shape and arithmetic depend on (the reference's dict
also carries switches such as `_attn_implementation` and `output_attentions`)."""


class LightProjector(nn.Module):
    """The reference's `LightProjector`: `layers` is one linear, or linears with GELU."""

    def __init__(self, aligner: dict[str, Any], dtype: torch.dtype) -> None:
        super().__init__()
        kind, width, out = aligner.get("projector_type"), aligner["input_dim"], aligner["n_embed"]
        if kind == "linear":
            self.layers: nn.Module = nn.Linear(width, out, dtype=dtype)
            return
        if kind != "mlp_gelu":
            raise ValueError(
                f"vit_aligner.projector_type: expected linear or mlp_gelu, got {kind!r}"
            )
        layers: list[nn.Module] = [nn.Linear(width, out, dtype=dtype)]
        for _ in range(1, int(aligner.get("depth", 1))):
            layers += [nn.GELU(), nn.Linear(out, out, dtype=dtype)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class HunyuanVisionEncoder(nn.Module):
    """Image -> [max_num_patches, hidden] rows of its ViT tokens."""

    def __init__(self, config: Any, dtype: torch.dtype) -> None:
        super().__init__()
        for key in ("vit", "vit_processor", "vit_aligner"):
            if not getattr(config, key, None):
                raise ValueError(f"{key}: the checkpoint's config has no vision encoder")
        vit = Siglip2VisionConfig(**{k: v for k, v in config.vit.items() if k in VIT_FIELDS})
        vit._attn_implementation = "sdpa"
        self.vision_model = Siglip2VisionModel(vit).to(dtype)
        self.vision_aligner = LightProjector(config.vit_aligner, dtype)
        if config.vit_aligner["n_embed"] != config.hidden_size:
            raise ValueError("vit_aligner.n_embed: must be the decoder's hidden_size")
        processor = config.vit_processor
        self.processor = Siglip2ImageProcessorPil(
            patch_size=int(processor["patch_size"]),
            max_num_patches=int(processor["max_num_patches"]),
            **{k: processor[k] for k in ("image_mean", "image_std") if k in processor},
        )
        self.num_tokens = int(processor["max_num_patches"])
        self.dtype = dtype
        self.requires_grad_(False)

    def load(self, weights: dict[str, torch.Tensor]) -> None:
        """The encoder's tensors by checkpoint name; ValueError naming a missing one."""
        load_part(self, weights, "", "vision")

    def patches(self, image: np.ndarray) -> dict[str, torch.Tensor]:
        """`Siglip2ImageProcessorPil` of one [H, W, 3] uint8 image: `pixel_values` [1, P, 3p²],
        `pixel_attention_mask` [1, P], `spatial_shapes` [1, 2] (patch rows, columns)."""
        out = self.processor(images=[image], return_tensors="pt")
        return {k: out[k] for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes")}

    @torch.no_grad()
    def forward(self, patches: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = self.vision_model(
            pixel_values=patches["pixel_values"].to(self.dtype),
            pixel_attention_mask=patches["pixel_attention_mask"],
            spatial_shapes=patches["spatial_shapes"],
        ).last_hidden_state
        return self.vision_aligner(hidden)[0]
