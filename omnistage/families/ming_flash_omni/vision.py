"""Ming-flash-omni-2.0's image encoder: the Qwen3-VL-style ViT (`vision.*`) and its
projector (`linear_proj.*`), as the reference's `extract_image_feature` runs them.

What the reference builds (read from the code index, not run: inclusionAI/Ming's
flash-omni-2.0 `modeling_bailingmm2.py` and vLLM-Omni's port of its `qwen3_moe_vit.py`,
`Qwen3MoeVisionTransformer`):

- the ViT is Qwen3-VL's vision model (Conv3d patch embed, a learned position table
  `pos_embed` bilinearly interpolated to the grid, 2-D rotary, LayerNorm blocks with a
  GELU MLP `linear_fc1` / `linear_fc2`, the 2x2 `merger` to `out_hidden_size`, and
  `deepstack_merger_list` mergers at `deepstack_visual_indexes`), with transformers'
  `Qwen3VLVisionModel` weight names, which runs it here (an encoder runs once per image:
  DESIGN.md §6 lets it wrap transformers);
- the deepstack features are computed by the ViT but not used: the projector's input is
  `image_emb_dim` = `out_hidden_size`, the main merger's rows (vLLM-Omni slices
  `[:, :image_emb_dim]` off the concatenation; the reference's thinker has no deepstack
  injection);
- `linear_proj`: `Linear(out_hidden_size, hidden)` then `mlp_depth - 1` times (GELU,
  `Linear(hidden, hidden)`);
- the projected rows are L2-normalized (`F.normalize(dim=-1)`), one row per merged 2x2
  patch group, images in order.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from omnistage.families.ming_omni.vision import MingImageEncoder

VISION_FIELDS = (
    "depth",
    "hidden_size",
    "hidden_act",
    "intermediate_size",
    "num_heads",
    "in_channels",
    "patch_size",
    "spatial_merge_size",
    "temporal_patch_size",
    "out_hidden_size",
    "num_position_embeddings",
    "deepstack_visual_indexes",
)
"""The `vision_config` fields the ViT reads (transformers' `Qwen3VLVisionConfig` names)."""


def vision_transformer(vision_config: dict[str, Any]) -> nn.Module:
    """transformers' Qwen3-VL ViT for a Ming-flash `vision_config` (a ValueError naming a
    field the ViT needs when it is missing)."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    for field in ("out_hidden_size", "num_position_embeddings"):
        if not vision_config.get(field):
            raise ValueError(f"vision_config.{field}: missing")
    side = int(vision_config["num_position_embeddings"]) ** 0.5
    if side != int(side):
        raise ValueError("vision_config.num_position_embeddings: not a square grid")
    settings = {k: vision_config[k] for k in VISION_FIELDS if k in vision_config}
    config = Qwen3VLVisionConfig(**settings)
    config._attn_implementation = "sdpa"
    return Qwen3VLVisionModel(config)


class MingFlashImageEncoder(MingImageEncoder):
    """Pixel patches and their grids -> the thinker's image rows (see the module docstring):
    Ming-Omni's encoder (projector, loading, normalized rows) over Qwen3-VL's ViT; its
    `forward` keeps the main merger's rows (the deepstack mergers' are dropped, as the
    reference drops them)."""

    build_vision = staticmethod(vision_transformer)
