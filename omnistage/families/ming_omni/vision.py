"""Ming-Omni's image encoder: the Qwen2.5-VL ViT (`vision.*`) and its projector
(`linear_proj.*`), as the reference's `extract_image_feature` runs them.

Read from the reference (inclusionAI/Ming, Ming-omni, commit 4876ed4):

- `qwen2_5_vit.py` is Qwen2.5-VL's vision transformer (patch embed, 2-D rotary, windowed
  attention except in `fullatt_block_indexes`, RMSNorm, SwiGLU MLP with biases, the
  2x2 patch merger to `out_hidden_size`) with the same weight names as transformers'
  `Qwen2_5_VisionTransformerPretrainedModel`, which runs it here (an encoder runs once
  per image: DESIGN.md §6 lets it wrap transformers);
- `linear_proj` (`modeling_bailingmm.py`): `Linear(image_emb_dim, hidden)` then
  `mlp_depth - 1` times (GELU, `Linear(hidden, hidden)`); the reference fixes
  `image_emb_dim = 8192` (the released ViT's `out_hidden_size`): here the projector's
  input is the config's `out_hidden_size`, and a checkpoint where the two differ fails
  at load by the projector weight's shape;
- the projected rows are L2-normalized (`F.normalize(dim=-1)`), one row per merged 2x2
  patch group, images in order.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.models.loader import iter_weights

PREFIXES = ("vision.", "linear_proj.")


def vision_transformer(vision_config: dict[str, Any]) -> nn.Module:
    """transformers' Qwen2.5-VL ViT for a Ming `vision_config` (its field names)."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    fields = (
        "depth",
        "hidden_size",
        "hidden_act",
        "intermediate_size",
        "num_heads",
        "in_channels",
        "patch_size",
        "spatial_merge_size",
        "temporal_patch_size",
        "window_size",
        "out_hidden_size",
        "fullatt_block_indexes",
    )
    config = Qwen2_5_VLVisionConfig(**{k: vision_config[k] for k in fields if k in vision_config})
    config._attn_implementation = "sdpa"
    return Qwen2_5_VisionTransformerPretrainedModel(config)


class MingImageEncoder(nn.Module):
    """Pixel patches and their grids -> the thinker's image rows (see the module docstring)."""

    @staticmethod
    def build_vision(vision_config: dict[str, Any]) -> nn.Module:
        """The ViT (a family with another ViT overrides this)."""
        return vision_transformer(vision_config)

    def __init__(self, vision_config: dict[str, Any], hidden_size: int, mlp_depth: int) -> None:
        super().__init__()
        self.vision = self.build_vision(vision_config)
        width = int(vision_config["out_hidden_size"])
        layers: list[nn.Module] = [nn.Linear(width, hidden_size)]
        for _ in range(1, mlp_depth):
            layers += [nn.GELU(), nn.Linear(hidden_size, hidden_size)]
        self.linear_proj = nn.Sequential(*layers)
        self.merge = int(vision_config.get("spatial_merge_size", 2))

    @classmethod
    def from_checkpoint(
        cls, path: str | os.PathLike, config: Any, dtype: torch.dtype
    ) -> MingImageEncoder:
        """The encoder of a Ming checkpoint (`config`: its `BailingMMConfig`), every
        `vision.*` / `linear_proj.*` weight loaded (a missing or extra one is a ValueError)."""
        if not config.vision_config:
            raise ValueError(f"{os.fspath(path)}: vision_config: this checkpoint has no ViT")
        model = cls(config.vision_config, config.llm_config.hidden_size, config.mlp_depth)
        state = dict(iter_weights(path, PREFIXES))
        missing = set(model.state_dict()) - set(state)
        if missing:
            raise ValueError(
                f"{os.fspath(path)}: image encoder weight {sorted(missing)[0]} missing"
            )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:  # an extra weight, or one of another shape
            raise ValueError(f"{os.fspath(path)}: image encoder weights: {e}") from e
        return model.to(dtype).eval()

    def num_tokens(self, grid_thw: torch.Tensor) -> list[int]:
        """Rows per image: its patches over the merge (the processor's `prod(grid) // 4`)."""
        return (grid_thw.prod(dim=-1) // (self.merge * self.merge)).tolist()

    @torch.no_grad()
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """[sum of rows, hidden] float32: every image's rows, in order."""
        dtype = next(self.parameters()).dtype
        merged = self.vision(pixel_values.to(dtype), grid_thw=grid_thw).pooler_output
        rows = self.linear_proj(merged).float()
        return F.normalize(rows, dim=-1)
